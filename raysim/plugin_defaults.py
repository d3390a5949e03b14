"""How the engine reads a plugin's optional names (``raysim.algorithm``'s table): one function for
each, which says what stands in where the plugin has none. A staged plugin without ``init``,
``payload`` or ``aggregator`` gets the initial params, those params sent, and ``Gather``; a plugin
without ``pseudo_gradient`` has its weighted-mean aggregate read as the mean delta; without
``client_payload`` every client receives the shared payload alone; without ``resume_state`` a
checkpoint's state is resumed as saved; a class or Config without a checking hook has no
problems to report.

Usage:
    state = fresh_state(algorithm, params, info)           # before round 0, any plugin
    payload = with_client_payloads(algorithm, payload, state, round_num, cohort, info)
    problems = model_problems(job.algorithm.config, model)  # [] for a Config without check_model
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, TypeVar

import torch
from pydantic import BaseModel
from torch import nn

from raysim import params as P
from raysim.aggregate import Aggregator, Gather, WeightedMean
from raysim.algorithm import A, Algorithm, AnyAlgorithm, plugin_hook
from raysim.checkpoint import CheckpointTrail
from raysim.gathered_updates import GatheredUpdates
from raysim.private_sums import ClientClipping, ClippedSums, Summing
from raysim.types import DataSpec, Params, Payload, RunInfo, ServerState

E = TypeVar("E")  # what the plugin keeps in ``ServerState.extra``


def init_state(params: Params, info: RunInfo, extra: E) -> ServerState[E]:
    """The server state before round 0: a copy of ``params``, no optimizer moments yet, and the
    plugin's own ``extra`` (None where it keeps nothing more). Every fresh state is built here:
    a plugin's ``init`` calls it (``raysim.train.server_opt`` re-exports it), as ``fresh_state`` does."""
    return ServerState(params=P.clone(params), buffer_keys=info.buffer_keys, extra=extra)


def fresh_state(algorithm: AnyAlgorithm[A], params: Params, info: RunInfo) -> ServerState:
    """The server state before round 0: the plugin's ``init``; else (a staged plugin without
    one) a copy of the initial params and nothing more."""
    if (hook := plugin_hook(algorithm, "init")) is not None:
        state: ServerState = hook(params, info)
        return state
    return init_state(params, info, None)


def first_payload(algorithm: AnyAlgorithm[A], state: ServerState, info: RunInfo) -> Payload:
    """What the first cohort receives: the plugin's ``payload`` of round 0; else (a staged plugin
    without one) the initial params, or none where clients start from their own architectures."""
    if (hook := plugin_hook(algorithm, "payload")) is not None:
        payload: Payload = hook(state, 0, info)
        return payload
    return Payload({} if info.mixes_models else P.to_numpy(state.params))


def aggregator_of(algorithm: AnyAlgorithm[A]) -> Aggregator[Any]:
    """How ``train_cohort`` folds client results: the plugin's ``aggregator``; else (a staged
    plugin without one) ``Gather``, every result kept for the protocol to read."""
    if (hook := plugin_hook(algorithm, "aggregator")) is not None:
        aggregator: Aggregator[Any] = hook()
        return aggregator
    return Gather()


def round_aggregator(
    algorithm: AnyAlgorithm[Any], private: ClientClipping | None, gathers: bool = False
) -> Aggregator[Any]:
    """How a round folds client results: the plugin's aggregator, or under central DP its sums of
    clipped contributions (a job whose aggregator is not ``Summing`` is refused before training),
    or with ``gathers`` (a robust rule, ALIE) every update its ``WeightedMean`` would sum."""
    inner = aggregator_of(algorithm)
    if gathers:
        if not isinstance(inner, WeightedMean):
            raise TypeError(f"a robust rule replaces a WeightedMean, not {type(inner).__name__}")
        return GatheredUpdates(inner)
    if private is None:
        return inner
    if not isinstance(inner, Summing):
        raise TypeError(f"central DP needs an aggregator that sums contributions, not {type(inner).__name__}")
    return ClippedSums(inner, private)


def client_state_type(algorithm: object) -> type | None:
    """``ClientState``, the type a worker rebuilds stored client state as; None: it stays plain."""
    kind = getattr(algorithm, "ClientState", None)
    return kind if isinstance(kind, type) else None


def model_problems(config: BaseModel, model: nn.Module) -> list[str]:
    """``config.check_model(model)`` on a built model of the job (FuseFL's split points)."""
    check = plugin_hook(config, "check_model")
    return list(check(model)) if check is not None else []


def models_problems(config: BaseModel, models: list[nn.Module], spec: DataSpec) -> list[str]:
    """``config.check_models(models, spec)`` across mixed architectures (FuseFL's split points)."""
    check = plugin_hook(config, "check_models")
    return list(check(models, spec)) if check is not None else []


def local_section(config: BaseModel) -> object | None:
    """``config.local``, the local SGD (``LocalTrainConfig``) the bench's plain loop repeats."""
    return getattr(config, "local", None)


def pseudo_gradient(algorithm: AnyAlgorithm[A], aggregate: A, params: Params) -> Params | None:
    """The round's pseudo-gradient (mean ``global - local``): the plugin's ``pseudo_gradient`` hook;
    else, for a ``WeightedMean`` aggregator (a weighted mean of deltas is a mean delta), the
    aggregate itself when its tensors are keyed like ``params``; else None (no pure aggregate)."""
    if aggregate is None:
        return None
    if (hook := plugin_hook(algorithm, "pseudo_gradient")) is not None:
        mean_delta: Params = hook(aggregate)
        return mean_delta
    if (
        isinstance(aggregator_of(algorithm), WeightedMean)
        and isinstance(aggregate, dict)
        and aggregate
        and set(aggregate) <= set(params)
        and all(isinstance(v, torch.Tensor) for v in aggregate.values())
    ):
        return aggregate
    return None


def with_client_payloads(
    algorithm: Algorithm[A],
    payload: Payload,
    state: ServerState,
    round_num: int,
    cohort: Iterable[int],
    info: RunInfo,
) -> Payload:
    """The round's payload with each cohort client's own part (the plugin's ``client_payload``
    hook); the payload as it is for a plugin without one."""
    if (hook := plugin_hook(algorithm, "client_payload")) is None:
        return payload
    return replace(payload, per_client={int(c): hook(state, round_num, int(c), info) for c in cohort})


def resume_state(
    algorithm: AnyAlgorithm[A], saved: ServerState, fresh: ServerState, trail: CheckpointTrail
) -> ServerState:
    """The state a resumed run starts from: the plugin's ``resume_state(saved, fresh, trail)``
    hook; else the checkpoint's state as saved."""
    hook = plugin_hook(algorithm, "resume_state")
    return hook(saved, fresh, trail) if hook is not None else saved
