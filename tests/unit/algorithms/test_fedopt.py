"""FedAvg / FedAdam on two clients with a linear model, against the numpy reference.

Each client holds a full batch, so one local step is w - lr * grad(w) (shuffling cannot matter).
FedAvg's new model is w0 - (n1 * d1 + n2 * d2) / (n1 + n2) with d_i = lr * grad_i(w0).
"""

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, grad, server_steps

from raysim import registry
from raysim.types import RunInfo

X1, Y1 = np.array([[1.0, 2.0], [0.5, -1.0], [0.0, 1.0]]), np.array([0, 1, 1])
X2, Y2 = np.array([[-1.0, 0.5]]), np.array([0])
LR = 0.1

INFO = RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC, seed=0)  # the run's facts


def build(name, **options):
    entry = registry.get("algorithm", name)
    return entry.factory(
        entry.config.model_validate({"local": {"lr": LR, "batch_size": 8, "epochs": 1}, **options})
    )


def run_round(algo):
    params = {"weight": torch.tensor(W0, dtype=torch.float32), "bias": torch.tensor(B0, dtype=torch.float32)}
    state = algo.init(params, RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC, seed=0))
    agg = algo.aggregator()
    acc = agg.zero()
    for i, (x, y) in enumerate([(X1, Y1), (X2, Y2)]):
        acc = agg.add(acc, i, algo.client_update(context(x, y, algo.payload(state, 0, INFO))))
    return algo.server_update(state, agg.result(acc), 0, INFO)[0]


def expected_deltas():
    (gw1, gb1), (gw2, gb2) = grad(W0, B0, X1, Y1), grad(W0, B0, X2, Y2)
    return LR * gw1, LR * gb1, LR * gw2, LR * gb2


def test_fedavg_is_the_example_weighted_average_of_local_models():
    dw1, db1, dw2, db2 = expected_deltas()
    state = run_round(build("fedavg"))
    assert np.allclose(state.params["weight"].numpy(), W0 - (3 * dw1 + dw2) / 4, atol=1e-6)
    assert np.allclose(state.params["bias"].numpy(), B0 - (3 * db1 + db2) / 4, atol=1e-6)


def test_fedadam_first_step_follows_reddi_et_al():
    dw1, _, dw2, _ = expected_deltas()
    g = (3 * dw1 + dw2) / 4
    # beta1 0.9, beta2 0.99, no bias correction; v starts at tau^2 (Algorithm 2: v_{-1} >= tau^2)
    m, v = 0.1 * g, 0.99 * 1e-6 + 0.01 * g * g
    state = run_round(build("fedadam"))
    assert np.allclose(state.params["weight"].numpy(), W0 - 0.01 * m / (np.sqrt(v) + 1e-3), atol=1e-6)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad", "fedavgm"])
def test_a_round_of_each_server_optimizer_matches_the_numpy_reference(name):
    dw1, db1, dw2, db2 = expected_deltas()
    g = {"weight": (3 * dw1 + dw2) / 4, "bias": (3 * db1 + db2) / 4}
    paper = {  # Reddi et al. 2021 (Algorithm 2, sec. 5); Hsu et al. 2019 for FedAvgM
        "fedadam": {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "v0": 1e-6},
        "fedyogi": {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3, "v0": 1e-6},
        "fedadagrad": {"lr": 0.01, "beta1": 0.0, "tau": 1e-3, "v0": 1e-6},
        "fedavgm": {"lr": 1.0, "momentum": 0.9},
    }[name]
    kind = {"fedadam": "adam", "fedyogi": "yogi", "fedadagrad": "adagrad", "fedavgm": "sgd"}[name]
    state = run_round(build(name))
    for key, w0 in (("weight", W0), ("bias", B0)):
        want = server_steps(kind, [g[key]], w0, **paper)[0]
        assert np.allclose(state.params[key].numpy(), want, atol=1e-6), key


def test_fedavgm_defaults_are_the_papers():
    config = registry.get("algorithm", "fedavgm").config()
    assert (config.server.kind, config.server.lr, config.server.momentum) == ("sgd", 1.0, 0.9)
    yogi = registry.get("algorithm", "fedyogi").config().server
    assert (yogi.kind, yogi.lr, yogi.beta2, yogi.eps) == ("yogi", 0.01, 0.99, 1e-3)
    adagrad = registry.get("algorithm", "fedadagrad").config().server
    assert (adagrad.beta1, adagrad.initial_second_moment) == (0.0, "eps_squared")


def test_client_reports_loss_and_example_weight():
    algo = build("fedavg")
    state = algo.init(
        {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()},
        RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC, seed=0),
    )
    result = algo.client_update(context(X1, Y1, algo.payload(state, 0, INFO)))
    z = X1 @ W0.T + B0
    ce = np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(3), Y1])
    assert result.weight == 3.0
    assert result.metrics["train/loss"] == pytest.approx(ce, rel=1e-5)
