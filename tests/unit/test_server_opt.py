"""Server optimizers against values computed by hand from Reddi et al. (2021) and Hsu et al. (2019)."""

import math

import pytest
import torch

from raysim.server_opt import ServerOptimizerConfig, server_step


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
