"""FedDF and DENSE end to end on the one-shot cache (serial backend, 4 clients of tiny digits):
both distil from the client models another one-shot method trained, FedDF on the clients' test
splits with early stopping, DENSE on a pool of generated images; a model without BatchNorm is
refused for DENSE before any worker starts."""

import numpy as np
import pytest

from jobs import tiny_job
from raysim.config import JobConfig
from raysim.engine.build import build, open_parts
from raysim.engine.loop import run
from raysim.errors import ConfigError
from raysim.tracking.tracker import MemoryTracker

FOUR_CLIENTS = {"partition": {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 20}}
LOCAL = {"epochs": 1, "batch_size": 16, "lr": 0.1}


def resnet_job(algorithm):
    """A ResNet-10 of width 4 (BatchNorm, for DENSE's statistics loss) on 4 clients of 8x8 digits."""
    return JobConfig.from_dict(
        {
            "name": "tiny-resnet",
            "seed": 3,
            "dataset": {"name": "digits", **FOUR_CLIENTS},
            "model": {"name": "resnet10", "width": 4},
            "algorithm": algorithm,
            "engine": {"num_rounds": 1, "cohort_size": 4},
            "resources": {"backend": "serial", "num_workers": 1},
            "tracking": {"enabled": False, "progress": False},
        }
    )


def test_feddf_distils_the_cached_client_models_on_the_clients_test_splits(tmp_path):
    cache = str(tmp_path / "cache")
    job = tiny_job(
        algorithm={"name": "oneshot_fedavg", "cache_dir": cache, "local": LOCAL},
        dataset=FOUR_CLIENTS,
        engine={"cohort_size": 4},
    )
    fedavg = run(job, output_dir=tmp_path / "a")
    distill = {"steps": 60, "patience": 60, "eval_every": 10, "batch_size": 32}
    feddf_job = tiny_job(
        algorithm={"name": "feddf", "cache_dir": cache, "local": LOCAL, "distill": distill},
        dataset=FOUR_CLIENTS,
        engine={"cohort_size": 4},
    )
    feddf = run(feddf_job, output_dir=tmp_path / "b")
    logged = dict(feddf.history)[0]
    assert logged["oneshot/trained_clients"] == 0  # the client models came from the cache
    test_rows = int(open_parts(feddf_job).store.num_examples("test").sum())
    assert logged["feddf/transfer_examples"] == test_rows - round(0.2 * test_rows)
    assert 0 <= logged["feddf/best_step"] <= logged["feddf/steps"] <= 60
    assert 0.0 < logged["feddf/validation_accuracy"] <= 1.0 and 0.0 < logged["eval/clients/accuracy"] <= 1.0
    moved = [
        not np.allclose(feddf.state.params[k], fedavg.state.params[k]) for k in fedavg.state.params
    ]  # distillation started at the average and changed it (unless step 0 stayed the best)
    assert any(moved) or logged["feddf/best_step"] == 0


def test_dense_distils_the_client_ensemble_on_a_pool_of_generated_images(tmp_path):
    synthesis = {"steps": 2, "batch_size": 8, "width": 4, "latent_dim": 8}
    algorithm = {
        "name": "dense",
        "cache_dir": str(tmp_path / "cache"),
        "local": LOCAL,
        "epochs": 3,
        "batch_size": 8,
    }
    result = run(resnet_job(algorithm | {"synthesis": synthesis}), output_dir=tmp_path / "a")
    logged = dict(result.history)[0]
    assert logged["oneshot/trained_clients"] == 4
    assert logged["dense/pool_images"] == 3 * 8  # one synthesized batch joins the pool per epoch
    assert np.isfinite(logged["dense/kd_loss"]) and np.isfinite(logged["dense/generator_loss"])
    assert 0.0 <= logged["eval/clients/accuracy"] <= 1.0


def test_dense_refuses_a_model_without_batchnorm_before_any_worker(tmp_path):
    with pytest.raises(ConfigError) as error:
        build(tiny_job(algorithm={"name": "dense"}), MemoryTracker(), None, tmp_path)
    assert "algorithm.synthesis.bn" in str(error.value) and "BatchNorm" in str(error.value)
    assert not (tmp_path / "client_state").exists()


@pytest.mark.parametrize("algorithm", ["ensemble", "fusefl"])
def test_a_poisoned_job_logs_the_backdoor_accuracy_of_the_ensemble_and_the_fused_model(tmp_path, algorithm):
    """Both score models the engine's evaluation does not see (M models, the fused towers), so
    each measures the triggered central test set itself, as the engine does for one model."""
    poisoned = FOUR_CLIENTS | {"central_test_size": 200, "poison": {"clients": [0, 1], "trigger_size": 4}}
    section = {"name": algorithm, "local": LOCAL} | (
        {"cache_dir": str(tmp_path / "c")} if algorithm == "ensemble" else {}
    )
    result = run(
        tiny_job(algorithm=section, dataset=poisoned, engine={"cohort_size": 4}), output_dir=tmp_path
    )
    logged = result.history[-1][1]
    assert 0.0 <= logged["eval/central/backdoor_accuracy"] <= 1.0 and "eval/central/accuracy" in logged


def test_feddf_refuses_a_transfer_store_the_job_lacks_before_training_any_client(tmp_path):
    cache = tmp_path / "cache"
    section = {"name": "feddf", "cache_dir": str(cache), "local": LOCAL, "transfer": {"store": "cifar"}}
    with pytest.raises(ConfigError) as error:
        run(tiny_job(algorithm=section, dataset=FOUR_CLIENTS, engine={"cohort_size": 4}), output_dir=tmp_path)
    assert "'cifar'" in str(error.value) and "evaluation.transfer" in str(error.value)
    assert not cache.exists()  # no client was trained
