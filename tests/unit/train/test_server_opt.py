"""Server optimizers against values computed by hand from Reddi et al. (2021) and Hsu et al. (2019)."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from raysim.train.server_opt import (
    ServerOptimizerConfig,
    apply_server_step,
    init_state,
    params_payload,
    server_step,
)
from raysim.types import DataSpec, RunInfo

sys.path.insert(0, str(Path(__file__).parents[1] / "algorithms"))  # the numpy reference lives there
from reference import server_steps  # noqa: E402


def step(kind, grads, **kw):
    params = {"w": torch.tensor([1.0])}
    state = {}
    for g in grads:
        params, state = server_step(
            params, {"w": torch.tensor([g])}, state, ServerOptimizerConfig(kind=kind, **kw)
        )
    return params["w"].item(), state


def test_sgd_lr_one_is_plain_averaging():
    w, _ = step("sgd", [0.25], lr=1.0)
    assert w == pytest.approx(0.75)


def test_sgd_momentum_two_steps():
    # m1 = 0.5; w1 = 1 - 0.1*0.5 = 0.95; m2 = 0.9*0.5 + 0.5 = 0.95; w2 = 0.95 - 0.095 = 0.855
    w, state = step("sgd", [0.5, 0.5], lr=0.1, momentum=0.9)
    assert w == pytest.approx(0.855)
    assert state["m"]["w"].item() == pytest.approx(0.95)


def test_adam_without_bias_correction():
    # g=0.2: m = 0.1*0.2 = 0.02; v = 0.01*0.04 = 4e-4; w = 1 - 0.01*0.02/(0.02+1e-3)
    w, _ = step("adam", [0.2], lr=0.01, beta1=0.9, beta2=0.99, eps=1e-3)
    assert w == pytest.approx(1 - 0.01 * 0.02 / (0.02 + 1e-3))


def test_adam_with_bias_correction_is_torch_adam_first_step():
    # m_hat = g, v_hat = g^2 -> w = 1 - lr * g / (|g| + eps)
    w, _ = step("adam", [0.2], lr=0.01, beta1=0.9, beta2=0.999, eps=1e-7, bias_correction=True)
    assert w == pytest.approx(1 - 0.01 * 0.2 / (0.2 + 1e-7))


def test_yogi_second_moment_update():
    # step 1: v0 = 0 < g^2 -> sign(v - g^2) = -1 -> v1 = 0 + 0.01*0.04 = 4e-4
    # step 2 with g=0.01: g^2 = 1e-4 < v1 -> v2 = 4e-4 - 0.01*1e-4 = 3.99e-4
    _, state = step("yogi", [0.2, 0.01], lr=0.01, beta1=0.9, beta2=0.99, eps=1e-3)
    assert state["v"]["w"].item() == pytest.approx(3.99e-4)
    m2 = 0.9 * 0.02 + 0.1 * 0.01
    w1 = 1 - 0.01 * 0.02 / (math.sqrt(4e-4) + 1e-3)
    w, _ = step("yogi", [0.2, 0.01], lr=0.01, beta1=0.9, beta2=0.99, eps=1e-3)
    assert w == pytest.approx(w1 - 0.01 * m2 / (math.sqrt(3.99e-4) + 1e-3), rel=1e-6)


def test_adagrad_accumulates_squares_and_steps_on_the_first_moment():
    # v = 0.04 + 0.09 = 0.13 after two steps; m1 = 0.1*0.2 = 0.02, m2 = 0.9*0.02 + 0.1*0.3 = 0.048
    w, state = step("adagrad", [0.2, 0.3], lr=0.1, beta1=0.9, eps=1e-3)
    assert state["v"]["w"].item() == pytest.approx(0.13)
    w1 = 1 - 0.1 * 0.02 / (math.sqrt(0.04) + 1e-3)
    assert w == pytest.approx(w1 - 0.1 * 0.048 / (math.sqrt(0.13) + 1e-3), rel=1e-6)


def test_nesterov_momentum_and_adam_bias_correction_on_step_two():
    # Nesterov: m1 = g, step g + 0.9 m1 = 1.9 g; m2 = 0.9 g + g = 1.9 g, step g + 0.9*1.9 g = 2.71 g
    w, _ = step("sgd", [0.1, 0.1], lr=1.0, momentum=0.9, nesterov=True)
    assert w == pytest.approx(1 - 0.19 - 0.271)
    # Adam with constant g: m_hat = g, v_hat = g^2 every step -> each step is lr * g / (g + eps)
    w, _ = step("adam", [0.2, 0.2], lr=0.01, beta1=0.9, beta2=0.999, eps=1e-7, bias_correction=True)
    assert w == pytest.approx(1 - 2 * 0.01 * 0.2 / (0.2 + 1e-7), rel=1e-6)


def test_plain_sgd_keeps_no_momentum_buffer():
    _, state = step("sgd", [0.5], lr=1.0)
    assert "m" not in state and state["step"] == 1


def test_buffers_are_averaged_not_optimised():
    params = {"w": torch.tensor([1.0]), "bn.running_mean": torch.tensor([4.0])}
    grads = {"w": torch.tensor([0.5]), "bn.running_mean": torch.tensor([1.0])}
    new, state = server_step(
        params,
        grads,
        {},
        ServerOptimizerConfig(kind="adam", lr=0.01),
        buffer_keys=frozenset({"bn.running_mean"}),
    )
    assert new["bn.running_mean"].item() == pytest.approx(3.0)
    assert "bn.running_mean" not in state["m"]


# Three rounds of pseudo-gradients over four coordinates: large, near tau (1e-3), tiny, and one
# that changes sign, so that v crosses g^2 (Yogi's sign flips) and a tau^2 start matters.
GRADS = np.array(
    [[0.2, 2e-3, 1e-5, -0.05], [0.1, 1e-3, -2e-5, 0.04], [0.3, -3e-3, 1e-5, 1e-4]], dtype=np.float64
)
W0 = np.array([1.0, -0.5, 0.25, 2.0])
HYPER = {"lr": 0.05, "beta1": 0.9, "beta2": 0.99, "eps": 1e-3}


def run_steps(config):
    params, state = {"w": torch.tensor(W0)}, {}
    for g in GRADS:
        params, state = server_step(params, {"w": torch.tensor(g)}, state, config)
    return params["w"].numpy(), state


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
@pytest.mark.parametrize("start", ["zero", "eps_squared"])
def test_adaptive_optimizers_match_the_numpy_reference(kind, start):
    config = ServerOptimizerConfig(kind=kind, initial_second_moment=start, **HYPER)
    w, state = run_steps(config)
    v0 = 1e-6 if start == "eps_squared" else 0.0
    want_w, want_m, want_v = server_steps(kind, GRADS, W0, lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3, v0=v0)
    assert np.allclose(w, want_w, rtol=1e-12, atol=0)
    assert np.allclose(state["m"]["w"].numpy(), want_m, rtol=1e-12, atol=0)
    assert np.allclose(state["v"]["w"].numpy(), want_v, rtol=1e-12, atol=0)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_and_bias_corrected_adam_match_the_numpy_reference(nesterov):
    w, _ = run_steps(ServerOptimizerConfig(kind="sgd", lr=0.7, momentum=0.9, nesterov=nesterov))
    assert np.allclose(w, server_steps("sgd", GRADS, W0, lr=0.7, momentum=0.9, nesterov=nesterov)[0])
    config = ServerOptimizerConfig(
        kind="adam", lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-7, bias_correction=True
    )
    want = server_steps("adam", GRADS, W0, lr=1e-3, beta2=0.999, tau=1e-7, bias_correction=True)[0]
    assert np.allclose(run_steps(config)[0], want, rtol=1e-12, atol=0)


def test_a_eps_squared_start_by_hand():
    # Adagrad, beta1 0, tau 0.1, g = 0.1: v1 = 0.01 + 0.01 = 0.02; w = 1 - 0.1 / (sqrt(0.02) + 0.1)
    config = ServerOptimizerConfig(
        kind="adagrad", lr=1.0, beta1=0.0, eps=0.1, initial_second_moment="eps_squared"
    )
    new, state = server_step({"w": torch.tensor([1.0])}, {"w": torch.tensor([0.1])}, {}, config)
    assert state["v"]["w"].item() == pytest.approx(0.02)
    assert new["w"].item() == pytest.approx(1 - 0.1 / (math.sqrt(0.02) + 0.1))
    # Yogi, tau 0.1, g = 0.2: g^2 = 0.04 > v0 = 0.01 -> v1 = 0.01 + 0.01 * 0.04 = 0.0104
    config = ServerOptimizerConfig(kind="yogi", lr=1.0, eps=0.1, initial_second_moment="eps_squared")
    _, state = server_step({"w": torch.tensor([1.0])}, {"w": torch.tensor([0.2])}, {}, config)
    assert state["v"]["w"].item() == pytest.approx(0.0104)


def test_bias_correction_refuses_a_eps_squared_start():
    with pytest.raises(ValidationError, match="initial_second_moment: zero"):
        ServerOptimizerConfig(kind="adam", bias_correction=True, initial_second_moment="eps_squared")


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_bias_correction_is_refused_where_nothing_would_be_corrected(kind):
    with pytest.raises(ValidationError, match="adam and yogi only"):
        ServerOptimizerConfig(kind=kind, bias_correction=True)


def test_init_state_copies_the_params_and_keeps_the_buffer_keys_and_the_extra():
    params = {"w": torch.tensor([1.0, 2.0]), "bn": torch.tensor([4.0])}
    info = RunInfo(4, 2, 3, DataSpec("classification", (2,), 2), seed=0, buffer_keys=frozenset({"bn"}))
    state = init_state(params, info, None)
    params["w"].add_(10.0)  # the state holds its own copy
    assert state.params["w"].tolist() == [1.0, 2.0] and state.buffer_keys == {"bn"}
    assert state.opt_state == {} and state.extra is None
    assert init_state(params, info, "kept").extra == "kept"


def test_params_payload_sends_the_params_as_numpy_and_nothing_else():
    info = RunInfo(4, 2, 3, DataSpec("classification", (2,), 2), seed=0)
    payload = params_payload(init_state({"w": torch.tensor([1.5, -2.0])}, info, None))
    assert isinstance(payload.params["w"], np.ndarray) and payload.params["w"].tolist() == [1.5, -2.0]
    assert payload.extra is None


def test_apply_server_step_steps_with_its_optimizer_and_averages_buffers():
    info = RunInfo(4, 2, 3, DataSpec("classification", (2,), 2), seed=0, buffer_keys=frozenset({"bn"}))
    config = ServerOptimizerConfig(lr=0.5, momentum=0.9)
    state = init_state({"w": torch.tensor([1.0, 2.0]), "bn": torch.tensor([4.0])}, info, None)
    mean_delta = {"w": torch.tensor([0.6, -0.8]), "bn": torch.tensor([1.0])}
    state, metrics = apply_server_step(state, mean_delta, config)
    # SGD momentum 0.9, lr 0.5: m1 = g; w1 = w - 0.5 g; m2 = 0.9 g + g = 1.9 g; w2 = w1 - 0.95 g
    assert state.params["w"].tolist() == pytest.approx([1.0 - 0.3, 2.0 + 0.4])
    assert state.params["bn"].item() == pytest.approx(3.0)  # the clients' average, not stepped
    assert metrics == {"server/delta_norm": pytest.approx(1.0)}  # ||(0.6, -0.8)||, buffers left out
    state, _ = apply_server_step(state, mean_delta, config)
    assert state.params["w"].tolist() == pytest.approx([0.7 - 0.95 * 0.6, 2.4 + 0.95 * 0.8])
    assert state.opt_state["m"]["w"].tolist() == pytest.approx([1.9 * 0.6, -1.9 * 0.8])
    kept, metrics = apply_server_step(state, None, config)  # nobody reported
    assert kept is state and metrics == {}
