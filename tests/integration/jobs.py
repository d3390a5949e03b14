"""Small jobs for integration tests: real digits, an MLP, a few rounds."""

from raysim.config import JobConfig, deep_merge


def tiny_job(**sections) -> JobConfig:
    base = {
        "name": "tiny",
        "seed": 3,
        "dataset": {
            "name": "digits",
            "partition": {"kind": "dirichlet", "num_clients": 20, "alpha": 0.5, "min_size": 20},
        },
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}},
        "engine": {"num_rounds": 3, "cohort_size": 6},
        "evaluation": {"every": 1},
        "resources": {"backend": "serial", "num_workers": 1},
        "tracking": {"enabled": False, "progress": False},
    }
    return JobConfig.from_dict(deep_merge(base, sections))
