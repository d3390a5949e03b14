"""The one-shot cache (``raysim.train.oneshot_cache``) is never trusted blindly: a damaged entry is
retrained, and the run's model equals one that found the cache intact; a cache laid out so that it
cannot be rewritten (a folder where a client's file goes, ``cache_dir`` a file) is refused in one
line naming the path and the fix. Serial backend, 4 clients of tiny digits."""

import shutil

import numpy as np
import pytest
import torch

from jobs import tiny_job
from raysim.engine.loop import run
from raysim.errors import CheckpointError

FOUR_CLIENTS = {"partition": {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 20}}
LOCAL = {"epochs": 1, "batch_size": 16, "lr": 0.1}


def oneshot_run(cache, output_dir):
    job = tiny_job(
        algorithm={"name": "oneshot_fedavg", "cache_dir": str(cache), "local": LOCAL},
        dataset=FOUR_CLIENTS,
        engine={"cohort_size": 4},
    )
    return run(job, output_dir=output_dir)


def trained_clients(result):
    return dict(result.history)[0]["oneshot/trained_clients"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A run that trained the clients and filled the cache: the model every other run must give."""
    root = tmp_path_factory.mktemp("reference")
    result = oneshot_run(root / "cache", root / "out")
    assert trained_clients(result) == 4
    return root / "cache", result.state.params


def same_params(a, b):
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensors' bytes
    path.write_bytes(bytes(data))


def edit_weight(path):
    saved = torch.load(path, weights_only=True)
    torch.save({**saved, "weight": -1e30}, path)


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path):
    path.write_bytes(b"")


def wrong_shape(path):
    saved = torch.load(path, weights_only=True)
    torch.save({**saved, "params": {k: v.flatten()[:1].clone() for k, v in saved["params"].items()}}, path)


@pytest.mark.parametrize("damage", [flip_a_byte, edit_weight, truncate, empty, wrong_shape])
def test_a_damaged_client_file_is_retrained_and_the_model_is_the_intact_runs(
    tmp_path, reference, damage, caplog
):
    cache, params = reference
    shutil.copytree(cache, tmp_path / "cache")
    [client_file] = (tmp_path / "cache").glob("*/client_1.pt")
    damage(client_file)
    retrained = oneshot_run(tmp_path / "cache", tmp_path / "a")
    assert trained_clients(retrained) == 4  # the damaged entry was not used
    [warning] = [r.getMessage() for r in caplog.records if "one-shot cache" in r.getMessage()]
    assert "client_1.pt" in warning and "retraining all 4 clients" in warning
    assert same_params(retrained.state.params, params)
    again = oneshot_run(tmp_path / "cache", tmp_path / "b")  # the rewritten entry verifies
    assert trained_clients(again) == 0 and same_params(again.state.params, params)


def test_an_intact_cache_is_read_back_and_gives_the_same_model(tmp_path, reference):
    cache, params = reference
    shutil.copytree(cache, tmp_path / "cache")
    result = oneshot_run(tmp_path / "cache", tmp_path / "a")
    assert trained_clients(result) == 0 and same_params(result.state.params, params)


def test_a_folder_where_a_client_file_goes_is_refused_naming_it(tmp_path, reference):
    cache, _ = reference
    shutil.copytree(cache, tmp_path / "cache")
    [client_file] = (tmp_path / "cache").glob("*/client_1.pt")
    client_file.unlink()
    client_file.mkdir()
    with pytest.raises(CheckpointError) as error:
        oneshot_run(tmp_path / "cache", tmp_path / "a")
    message = str(error.value)
    assert "\n" not in message and str(client_file) in message and "algorithm.cache_dir" in message
    assert client_file.is_dir()  # nothing of the user's was deleted


def test_a_cache_dir_that_is_a_file_is_refused_naming_the_key(tmp_path):
    (tmp_path / "cache").write_text("not a folder")
    with pytest.raises(CheckpointError) as error:
        oneshot_run(tmp_path / "cache", tmp_path / "a")
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / "cache") in message and "algorithm.cache_dir" in message
