"""raysim's copy of MLflow's rule for param and tag keys agrees with MLflow's own validator."""

import pytest
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import _validate_param

from raysim.config.mlflow_names import MAX_KEY_LENGTH, key_problem

KEYS = [
    "sweep.grid.algorithm.local.lr",
    "sweep.grid.dataset.partition.A-shards2.kind",
    "sweep.grid.dataset.partition.../evil.kind",  # "..." is one part of a path, not "..": taken
    "sweep.grid.dataset.partition.a/../evil.kind",
    "sweep.grid.x.a b:c",
    "sweep.grid.x.é",
    "sweep.grid.x.'q'",
    "sweep.grid.x.a//b",
    "sweep.grid.x.a/",
    "/sweep",
    "..",
    ".",
    "",
    "x" * MAX_KEY_LENGTH,
    "x" * (MAX_KEY_LENGTH + 1),
]


@pytest.mark.parametrize("key", KEYS)
def test_a_key_is_refused_exactly_when_mlflow_refuses_it(key):
    try:
        _validate_param(key, "value")
        mlflow_takes_it = True
    except MlflowException:
        mlflow_takes_it = False
    assert (key_problem(key) is None) == mlflow_takes_it
