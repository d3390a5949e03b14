"""Server optimizers that step on the mean client delta (the pseudo-gradient).

FedAvg is SGD with lr 1; FedAvgM adds momentum (Hsu et al. 2019, arXiv:1909.06335); FedAdam,
FedYogi and FedAdagrad follow Reddi et al. 2021 (arXiv:2003.00295), Algorithm 2: no bias
correction, ``eps`` is their adaptivity (their tau), the first moment starts at zero and the
second at ``v_{-1} = eps^2`` (``initial_second_moment: eps_squared``) or at zero. ``bias_correction=True``
gives torch-style Adam (FedFish's server, betas (0.9, 0.999), eps 1e-7), whose moments start at
zero.

Float buffers (BatchNorm running statistics) are not optimised: they take the clients' average.

The server half of the FedAvg family is three plain functions each plugin calls from its own
methods: ``init_state`` (in ``init``), ``params_payload`` (in ``payload``) and
``apply_server_step`` (in ``server_update``, on the mean delta its ``WeightedMean`` aggregator made).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, TypeVar

import torch
from pydantic import BaseModel, Field, model_validator

from raysim import params as P
from raysim.plugin_defaults import init_state as init_state  # re-exported: the FedAvg family's init calls it
from raysim.types import Metrics, OptState, Params, Payload, ServerState

E = TypeVar("E")  # the plugin's ``ServerState.extra``


class ServerOptimizerConfig(BaseModel, frozen=True, extra="forbid"):
    """Server optimizer applied to ``mean(delta)`` each round."""

    kind: Literal["sgd", "adam", "yogi", "adagrad"] = "sgd"
    lr: float = Field(1.0, gt=0, allow_inf_nan=False)  # inf passes gt=0
    momentum: float = Field(0.0, ge=0, lt=1)  # sgd only (FedAvgM)
    nesterov: bool = False
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.99, ge=0, lt=1)
    eps: float = Field(1e-3, gt=0, allow_inf_nan=False)  # the adaptivity Reddi et al. call tau
    bias_correction: bool = False
    # where the second moment v starts (adam, yogi, adagrad). Reddi et al.'s Algorithm 2 starts at
    # v_{-1} = eps^2 (FedAdam, FedYogi and FedAdagrad set that); the generic default is zero, the
    # torch convention that bias correction assumes (FedFish's server, hand-built optimizers).
    initial_second_moment: Literal["zero", "eps_squared"] = "zero"

    @model_validator(mode="after")
    def _bias_correction_needs_zero_start(self) -> "ServerOptimizerConfig":
        if self.bias_correction and self.kind in ("sgd", "adagrad"):
            raise ValueError(f"bias_correction applies to adam and yogi only, not {self.kind}")
        if self.bias_correction and self.initial_second_moment != "zero":
            raise ValueError(
                "bias_correction divides by (1 - beta^t), which is right only for moments that "
                "start at zero: set initial_second_moment: zero, or bias_correction: false"
            )
        return self


def server_step(
    params: Params,
    pseudo_grad: Params,
    opt_state: OptState,
    config: ServerOptimizerConfig,
    buffer_keys: frozenset[str] = frozenset(),
) -> tuple[Params, OptState]:
    """One server step; returns new params and new optimizer state (inputs are not modified).

    Args:
        params: current global params.
        pseudo_grad: mean of client deltas (``global - local``), same keys as params.
        opt_state: ``{"step": int, "m": Params, "v": Params}`` as returned last time, or {}.
        config: which optimizer and its hyper-parameters.
        buffer_keys: float buffers, set to ``params - pseudo_grad`` (the clients' average).
    """
    step = int(opt_state.get("step", 0)) + 1
    m_old, v_old = opt_state.get("m", {}), opt_state.get("v", {})
    new_params, m_new, v_new = {}, {}, {}
    for key, w in params.items():
        g = pseudo_grad[key].to(w.dtype)
        if key in buffer_keys:
            new_params[key] = w - g
            continue
        m = m_old[key] if key in m_old else _zeros_if_kept(w, config.kind != "sgd" or config.momentum > 0)
        v = v_old[key] if key in v_old else _initial_second_moment(w, config)
        new_params[key], m_new[key], v_new[key] = _update(w, g, m, v, step, config)
    new_state: OptState = {"step": step}
    if config.kind != "sgd" or config.momentum > 0:  # plain SGD keeps no model-sized buffer
        new_state["m"] = m_new
    if config.kind != "sgd":
        new_state["v"] = v_new
    return new_params, new_state


def _zeros_if_kept(w: torch.Tensor, kept: bool) -> torch.Tensor:
    """A moment's zero start, or an empty stand-in for one plain SGD never reads."""
    return torch.zeros_like(w) if kept else w.new_empty(0)


def _initial_second_moment(w: torch.Tensor, config: ServerOptimizerConfig) -> torch.Tensor:
    if config.kind == "sgd":  # never read
        return w.new_empty(0)
    if config.initial_second_moment == "eps_squared":
        return torch.full_like(w, config.eps**2)
    return torch.zeros_like(w)


def _update(
    w: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, c: ServerOptimizerConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if c.kind == "sgd":
        if c.momentum == 0:  # lr 1 (FedAvg): w - g, the same bits as w - 1.0 * g in one pass
            return (w - g if c.lr == 1 else w - c.lr * g), m, v
        m = c.momentum * m + g
        direction = g + c.momentum * m if c.nesterov else m
        return w - c.lr * direction, m, v
    m = c.beta1 * m + (1 - c.beta1) * g  # Reddi et al.'s Algorithm 2: all three keep m
    if c.kind == "adagrad":
        v = v + g * g
        return w - c.lr * m / (v.sqrt() + c.eps), m, v
    if c.kind == "adam":
        v = c.beta2 * v + (1 - c.beta2) * g * g
    else:  # yogi: v moves towards g² by at most (1 - beta2)·g² per step
        v = v - (1 - c.beta2) * g * g * torch.sign(v - g * g)
    m_hat, v_hat = m, v
    if c.bias_correction:
        m_hat = m / (1 - c.beta1**step)
        v_hat = v / (1 - c.beta2**step)
    return w - c.lr * m_hat / (v_hat.sqrt() + c.eps), m, v


def params_payload(state: ServerState[E]) -> Payload[None]:
    """The FedAvg broadcast: the global params, nothing more."""
    return Payload(P.to_numpy(state.params))


def apply_server_step(
    state: ServerState[E], mean_delta: Params | None, config: ServerOptimizerConfig
) -> tuple[ServerState[E], Metrics]:
    """The FedOpt server half for any plugin whose clients send a mean delta: the server
    optimizer steps on it (``server_step``); None (nobody reported) keeps the model."""
    if mean_delta is None:
        return state, {}
    params, opt_state = server_step(state.params, mean_delta, state.opt_state, config, state.buffer_keys)
    norm = P.global_norm(mean_delta, skip=state.buffer_keys)  # parameters only
    return replace(state, params=params, opt_state=opt_state), {"server/delta_norm": norm}
