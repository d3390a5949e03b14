"""A sweep cell's reservation on the cluster: one worker's CPUs and GPU share."""

from raysim.config import JobConfig
from raysim.sweep.sweep_runs import cell_resources

BASE = {
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def job_with(**resources) -> JobConfig:
    return JobConfig.from_dict({**BASE, "resources": {"backend": "serial", **resources}})


def test_a_cell_reserves_one_workers_cpus_and_gpu_share():
    assert cell_resources(job_with(cpus_per_worker=2, gpus_per_worker=0.25)) == (2, 0.25)


def test_a_measured_gpu_share_is_the_whole_card_in_a_cell():
    """A cell trains on the serial backend, where ``gpus_per_worker: auto`` means the whole card
    (before, the reservation was handed the string ``auto``)."""
    assert cell_resources(job_with(gpus_per_worker="auto")) == (1.0, 1.0)
