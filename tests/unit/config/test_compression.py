"""The ``compression:`` section: one clear line for each bad setting, before any training."""

from __future__ import annotations

import pytest

from raysim.compress.quantize import Quantized
from raysim.compress.upload import encoder_of
from raysim.config import JobConfig
from raysim.errors import ConfigError

BASE = {
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 4}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
}


def job(upload: dict, **sections) -> JobConfig:
    return JobConfig.from_dict({**BASE, "compression": {"upload": upload}, **sections})


@pytest.mark.parametrize(
    "upload, key",
    [
        ({"kind": "topk", "fraction": 0}, "compression.upload.topk.fraction"),
        ({"kind": "randomk", "fraction": 1.5}, "compression.upload.randomk.fraction"),
        ({"kind": "qsgd", "bits": 0}, "compression.upload.qsgd.bits"),
        ({"kind": "qsgd", "bits": 17}, "compression.upload.qsgd.bits"),
        ({"kind": "qsgd", "bits": 4, "bucket": -1}, "compression.upload.qsgd.bucket"),
        ({"kind": "powersgd", "rank": 0}, "compression.upload.powersgd.rank"),
        ({"kind": "zip"}, "compression.upload"),
    ],
)
def test_a_bad_setting_is_one_line_naming_its_key(upload, key):
    with pytest.raises(ConfigError) as info:
        job(upload)
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(key), info.value.problems


def test_fraction_one_and_sixteen_bits_are_allowed_and_the_section_round_trips():
    assert job({"kind": "topk", "fraction": 1.0}).compression.upload.error_feedback is True
    config = job({"kind": "qsgd", "bits": 16})
    assert config.compression.upload.error_feedback is False  # unbiased: no feedback unless asked
    assert JobConfig.from_dict(config.to_dict()) == config
    assert "compression" not in JobConfig.from_dict(BASE).to_dict()


@pytest.mark.parametrize("name", ["scaffold", "fusefl", "oneshot_fedavg"])
def test_a_plugin_without_a_parameter_delta_is_refused_by_name(name):
    with pytest.raises(ConfigError, match=f"algorithm '{name}' sends no parameter delta"):
        job({"kind": "sign"}, algorithm={"name": name})


@pytest.mark.parametrize("name", ["fedavg", "fedadam", "fedprox", "fedfish", "fedgucci"])
def test_the_fedavg_family_is_accepted(name):
    assert job({"kind": "sign"}, algorithm={"name": name}).compression is not None


def test_ima_is_judged_by_its_inner_algorithm():
    ima = {"name": "ima", "average_from": 1, "window": 2}
    assert job({"kind": "sign"}, algorithm=ima | {"inner": {"name": "fedavg"}}, engine={"num_rounds": 3})
    with pytest.raises(ConfigError, match="'ima' sends no parameter delta"):
        job({"kind": "sign"}, algorithm=ima | {"inner": {"name": "scaffold"}}, engine={"num_rounds": 3})


def test_local_dp_is_refused_with_compression():
    local = {"local": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-5}
    with pytest.raises(ConfigError, match="privacy.local noises every coordinate"):
        job({"kind": "topk", "fraction": 0.1}, privacy=local)


def downloading(download: dict, **sections) -> JobConfig:
    return JobConfig.from_dict({**BASE, "compression": {"download": download}, **sections})


@pytest.mark.parametrize(
    "download, key",
    [
        ({"kind": "topk", "fraction": 0}, "compression.download.topk.fraction"),
        ({"kind": "randomk", "fraction": 1.5}, "compression.download.randomk.fraction"),
        ({"kind": "qsgd", "bits": 17}, "compression.download.qsgd.bits"),
        ({"kind": "powersgd", "rank": 0}, "compression.download.powersgd.rank"),
    ],
)
def test_a_bad_download_setting_is_one_line_naming_its_key(download, key):
    with pytest.raises(ConfigError) as info:
        downloading(download)
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(key), info.value.problems


def test_a_compression_section_naming_neither_direction_is_one_line():
    with pytest.raises(ConfigError, match="set upload, download or both") as info:
        JobConfig.from_dict({**BASE, "compression": {}})
    assert len(info.value.problems) == 1


def test_download_alone_round_trips_and_leaves_the_upload_unset():
    config = downloading({"kind": "randomk", "fraction": 0.1})
    assert config.compression.upload is None and config.compression.download.error_feedback is True
    assert JobConfig.from_dict(config.to_dict()) == config
    assert list(config.to_dict()["compression"]) == ["download"]
    assert list(job({"kind": "sign"}).to_dict()["compression"]) == ["upload"]  # reads as before


def test_a_download_for_a_plugin_without_a_plain_broadcast_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="compression.download: algorithm 'scaffold'") as info:
        downloading({"kind": "sign"}, algorithm={"name": "scaffold"})
    assert len(info.value.problems) == 1
    both = {**BASE, "algorithm": {"name": "scaffold"}}
    with pytest.raises(ConfigError) as info:  # both directions: still one line
        JobConfig.from_dict(
            both | {"compression": {"upload": {"kind": "sign"}, "download": {"kind": "sign"}}}
        )
    assert len(info.value.problems) == 1


def test_local_dp_allows_a_compressed_download():
    local = {"local": {"clip_bound": 1.0, "noise_multiplier": 1.0}, "delta": 1e-5}
    assert downloading({"kind": "topk", "fraction": 0.1}, privacy=local).compression is not None


def test_qsgd_buckets_512_values_by_default_and_null_or_0_means_the_whole_tensor():
    assert job({"kind": "qsgd", "bits": 4}).compression.upload.bucket == 512
    for whole in (0, None):
        upload = job({"kind": "qsgd", "bits": 4, "bucket": whole}).compression.upload
        assert encoder_of(upload) == Quantized(4, 0)
    assert encoder_of(job({"kind": "qsgd", "bits": 2, "bucket": 64}).compression.upload) == Quantized(2, 64)


def test_a_download_without_error_feedback_is_refused():
    """The clients train from x-hat while the server evaluates and saves x_t: without a residual
    their gap is the sum of every round's encoding error (an outside review)."""
    with pytest.raises(ConfigError, match="compression.download.error_feedback: false") as info:
        downloading({"kind": "qsgd", "bits": 4})  # QSGD: no error feedback by default
    assert len(info.value.problems) == 1
    downloading({"kind": "qsgd", "bits": 4, "error_feedback": True})
