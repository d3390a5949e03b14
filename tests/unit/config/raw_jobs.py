"""Raw job mappings for the config tests, and the problems a mapping's validation reports."""

from pathlib import Path

import pytest

from raysim.config import JobConfig
from raysim.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


BASE = {
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def problems_of(raw):
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(raw)
    return info.value.problems
