"""IMA: iterative moving averaging of the global model in the late rounds (Zhou, Lin, Zhang and
Tsang, "Understanding and Improving Model Averaging in Federated Learning on Heterogeneous Data",
IEEE TMC 2024, arXiv:2305.07845; author code TailinZhou/FedIMA).

A wrapper around any registered round-based algorithm, the ``inner`` one. Every round, from round 0,
it keeps the last ``window`` (P) models the inner server update made: FedAvg's FMA aggregates (IMA
paper, Sec. 6.2, Algorithm 1; window and warm-up as in the authors' code). From ``average_from``
(the paper's t_s) on, once the window is full (the author code never averages fewer than P models;
it waits for ``t >= P``, one round more when t_s < P), the global model, which is broadcast and
evaluated, is the uniform mean of that window (IMA paper, Eq. 5):

    w_bar^t = (1/P) * sum_{i=t-P+1..t} w^i  for t >= max(t_s, P - 1),   w_bar^t = w^t  before.

An ``init`` whose run would end before that round is refused: it would be its inner algorithm.

The window holds the inner's models, never earlier means: a sliding simple moving average of the
FMA trajectory, fed back to the clients every round.

``placement`` (as in the authors' code):
- ``after_server_update``: IMA averages whatever the inner's own server update makes (FedAvg,
  FedProx, SCAFFOLD, FedFish; FedNova and FedGMA "average the method's output").
- ``before_server_optimizer``: the authors' FedAdam/FedYogi order. The window holds the pure
  aggregates ``global - pseudo_gradient`` and from t_s the server optimizer steps toward their
  mean (its pseudo-gradient becomes ``global - mean(H)``). It needs an inner whose aggregate is
  the mean client delta. ``reset_server_opt_state`` zeroes the optimizer's moments at t_s (the
  author code means to; its reset is lost after one round).

Mild client exploration (IMA paper, Sec. 6.3): from t_s the inner's client lr follows ``exploration``,
starting from the lr it reached; the default x0.97 per round gives
``lr_t = lr0 * 0.99^t_s * 0.97^(t - t_s)`` over an inner ``lr_decay: 0.99``. ``exploration:
null`` keeps the inner's schedule (Table III's NAD); ``epochs_exploration`` is Table III's ED.

Before t_s an IMA run is its inner algorithm's run bit for bit, so it may branch from that run's
checkpoint of round t_s - 1 (IMA paper, Sec. 7.2.3, Table II): ``resume_state`` fills the window with the
parent's models of its last P rounds, read from its per-round checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Generic, Literal, TypeGuard, TypeVar

import torch
from pydantic import BaseModel, Field, field_serializer, field_validator, model_validator

from raysim import params as P
from raysim import registry
from raysim.aggregate import Aggregator, WeightedMean
from raysim.algorithm import Algorithm
from raysim.checkpoint import CheckpointTrail
from raysim.config import JobCore, PluginSection, nested_plugin
from raysim.config.plugins import update_delta
from raysim.errors import CheckpointError, ConfigError
from raysim.plugin_defaults import resume_state as completed_state
from raysim.registry import register
from raysim.stored import plain
from raysim.train.local import LocalTrainConfig, lr_schedule
from raysim.train.schedules import EpochDecay, Exponential, Schedule, Switch
from raysim.types import ClientContext, ClientResult, Metrics, OptState, Params, Payload, RunInfo, ServerState

A = TypeVar("A")  # the inner algorithm's aggregate
E = TypeVar("E")  # the inner algorithm's ServerState.extra
_OLD_WINDOW = "ima_window"  # where checkpoints before IMAState kept the window, beside the inner's keys


@dataclass(frozen=True)
class IMAState(Generic[E]):
    """IMA's ``ServerState.extra``: the inner algorithm's own, and the window."""

    inner: E  # the inner algorithm's ``ServerState.extra``
    window: list[Params]  # the last P inner models (or pure aggregates), oldest first


class EpochExploration(BaseModel, frozen=True, extra="forbid"):
    """From IMA's ``average_from`` on, one local epoch fewer every ``every`` rounds (Table III's ED)."""

    every: int = Field(20, ge=1)
    min_epochs: int = Field(1, ge=1)


class IMAConfig(BaseModel, frozen=True, extra="forbid"):
    """IMA: from average_from on, the global model is the mean of the last window models (Zhou et al.
    2024)."""

    inner: PluginSection  # {name: <algorithm>, **its options}, validated by that plugin's Config
    window: int = Field(5, ge=1)  # P (Table VII)
    average_from: int = Field(ge=0)  # t_s: the paper takes 3T/4
    exploration: Schedule | None = Exponential(decay=0.97)  # the client lr from t_s on
    epochs_exploration: EpochExploration | None = None
    placement: Literal["after_server_update", "before_server_optimizer"] = "after_server_update"
    reset_server_opt_state: bool = False  # at t_s

    @field_validator("inner", mode="before")
    @classmethod
    def _round_based_algorithm(cls, raw: Any) -> PluginSection:
        name = raw.get("name") if isinstance(raw, dict) else getattr(raw, "name", None)
        if name == "ima":
            raise ValueError("IMA wraps another algorithm, not itself: name one such as fedavg")
        section = nested_plugin("algorithm", raw)
        if callable(getattr(registry.get("algorithm", section.name).factory, "protocol", None)):
            raise ValueError(
                f"{section.name} runs its own protocol (a staged method); IMA wraps algorithms of "
                f"identical rounds"
            )
        return section

    @field_serializer("inner")
    def _as_written(self, inner: PluginSection) -> dict[str, Any]:
        return inner.to_dict()  # {name, **options}: what a worker validates again

    def update_delta(self) -> str | None:
        """Where the inner's update holds its delta (``compression`` encodes it): the clients run
        the inner's ``client_update``."""
        return update_delta(registry.get("algorithm", self.inner.name).factory, self.inner.config)

    def check_job(self, job: JobCore) -> list[str]:
        """Checked when the job loads (the dry run too): an IMA that would never average."""
        return never_averages(self, job.engine.num_rounds)

    @model_validator(mode="after")
    def _composable(self) -> IMAConfig:
        inner = build_inner(self)
        if self.placement == "before_server_optimizer" and not _aggregates_mean_delta(inner):
            raise ValueError(
                f"placement before_server_optimizer replaces the mean client delta, and "
                f"{self.inner.name}'s aggregate is not one: use placement: after_server_update"
            )
        return self


def explored(config: IMAConfig) -> BaseModel:
    """The inner plugin's config, its ``local`` training switched to IMA's client exploration
    at ``average_from`` (a pure function of the config: every worker builds the same).

    Raises:
        ValueError: exploration is asked of an inner plugin without ``local`` training options.
    """
    inner = config.inner.config
    if config.exploration is None and config.epochs_exploration is None:
        return inner
    local = getattr(inner, "local", None)
    if not isinstance(local, LocalTrainConfig):
        raise ValueError(
            f"exploration changes the inner algorithm's local training, and {config.inner.name} "
            f"has no local section: set exploration: null and epochs_exploration: null"
        )
    update: dict[str, Any] = {}
    if config.exploration is not None:
        switch = Switch(from_round=config.average_from, before=lr_schedule(local), after=config.exploration)
        update |= {"lr_schedule": switch, "lr_decay": 1.0}
    if config.epochs_exploration is not None:
        if local.epochs_schedule is not None:
            raise ValueError("inner.local.epochs_schedule is set already: set epochs_exploration: null")
        epochs = config.epochs_exploration
        update["epochs_schedule"] = EpochDecay(
            from_round=config.average_from, every=epochs.every, min_epochs=epochs.min_epochs
        )
    return inner.model_copy(update={"local": local.model_copy(update=update)})


def never_averages(config: IMAConfig, rounds: int) -> list[str]:
    """Why an IMA over ``rounds`` rounds would never average (it would silently be its inner)."""
    problems = []
    if config.average_from >= rounds:
        problems.append(
            f"algorithm.average_from: IMA starts at round {config.average_from}, but the run ends "
            f"after round {rounds - 1}, so it would only be its inner algorithm; set average_from "
            f"below {rounds} (the paper takes 3T/4: {3 * rounds // 4})"
        )
    if config.window > rounds:
        problems.append(
            f"algorithm.window: IMA averages once its window of {config.window} models is full, "
            f"but the run has {rounds} rounds, so it would only be its inner algorithm; set window "
            f"to at most {rounds}"
        )
    return problems


def build_inner(config: IMAConfig) -> Algorithm[Any]:
    """The inner plugin, built from its explored config."""
    inner: Algorithm[Any] = registry.get("algorithm", config.inner.name).factory(explored(config))
    return inner


@register("algorithm", "ima")
class IMA(Generic[A]):
    """IMA: the global model is the moving average of the inner algorithm's last models."""

    Config = IMAConfig

    def __init__(self, config: IMAConfig) -> None:
        self.config = config
        self.inner: Algorithm[A] = build_inner(config)  # round-based: the Config refuses staged plugins
        self.ClientState = getattr(self.inner, "ClientState", None)  # the clients keep the inner's
        if callable(getattr(self.inner, "pseudo_gradient", None)):  # probes read the pure aggregate
            self.pseudo_gradient = getattr(self.inner, "pseudo_gradient")

    def init(self, params: Params, info: RunInfo) -> ServerState[IMAState[object]]:
        """The inner's state and an empty window; an IMA that would never average is refused (it
        would silently be its inner algorithm)."""
        if problems := never_averages(self.config, info.num_rounds):
            raise ConfigError(problems)
        return _with_window(self.inner.init(params, info), [])

    def payload(self, state: ServerState[IMAState[object]], round_num: int, info: RunInfo) -> Payload[object]:
        return self.inner.payload(_inner_state(state), round_num, info)

    def client_update(self, ctx: ClientContext[object, object]) -> ClientResult[object, object]:
        return self.inner.client_update(ctx)

    def aggregator(self) -> Aggregator[A]:
        return self.inner.aggregator()

    def server_update(
        self, state: ServerState[IMAState[object]], aggregate: A, round_num: int, info: RunInfo
    ) -> tuple[ServerState[IMAState[object]], Metrics]:
        config, window = self.config, state.extra.window
        if round_num == config.average_from and config.reset_server_opt_state:
            state = replace(state, opt_state=OptState())
        if aggregate is None:  # nobody reported: the inner keeps its model, the window its models
            new, metrics = self.inner.server_update(_inner_state(state), aggregate, round_num, info)
            active = self._active(round_num, window)
            return _with_window(new, window), metrics | {"ima/active": float(active)}
        if config.placement == "before_server_optimizer":
            return self._before_server_optimizer(state, aggregate, round_num, info)
        new, metrics = self.inner.server_update(_inner_state(state), aggregate, round_num, info)
        window = [*window, dict(new.params)][-config.window :]
        active = self._active(round_num, window)
        params = mean_model(window) if active else new.params
        metrics |= {"ima/active": float(active), "ima/shift_norm": P.distance(new.params, params)}
        return _with_window(replace(new, params=params), window), metrics

    def _active(self, round_num: int, window: list[Params]) -> bool:
        """Whether this round's global model is the window mean: from t_s on, once the window is
        full (never a part-filled window, as in the author code)."""
        return round_num >= self.config.average_from and len(window) == self.config.window

    def _before_server_optimizer(
        self, state: ServerState[IMAState[object]], aggregate: A, round_num: int, info: RunInfo
    ) -> tuple[ServerState[IMAState[object]], Metrics]:
        """The window of pure aggregates; from t_s the server optimizer's target is their mean."""
        inner = self.inner
        if not _aggregates_mean_delta(inner) or not isinstance(aggregate, dict):  # IMAConfig checked
            raise TypeError("IMA before_server_optimizer needs an inner whose aggregate is the mean delta")
        fma = P.pure_aggregate(state.params, aggregate)
        window = [*state.extra.window, fma][-self.config.window :]
        active = self._active(round_num, window)
        target = mean_model(window) if active else fma
        mean_delta = {k: state.params[k] - target[k] for k in aggregate} if active else aggregate
        new, metrics = inner.server_update(_inner_state(state), mean_delta, round_num, info)
        metrics |= {"ima/active": float(active), "ima/shift_norm": P.distance(fma, target)}
        return _with_window(new, window), metrics

    def resume_state(
        self, saved: ServerState[object], fresh: ServerState[IMAState[object]], trail: CheckpointTrail
    ) -> ServerState[IMAState[object]]:
        """An IMA checkpoint keeps its window; another run's (the inner algorithm's) gets the
        parent's models of its last P rounds, from the checkpoints beside the given one.

        ``saved.extra`` is plain, as the checkpoint holds it: IMAState's fields; or, written before
        IMAState, the inner's fields with the window beside them under "ima_window"; or the
        inner algorithm's own."""
        extra = plain(saved.extra)  # plain already when read from a checkpoint
        if isinstance(extra, dict) and set(extra) == {"inner", "window"}:
            inner, window = extra["inner"], extra["window"]
        elif isinstance(extra, dict) and _OLD_WINDOW in extra:
            inner = {k: v for k, v in extra.items() if k != _OLD_WINDOW}
            window = extra[_OLD_WINDOW]
        else:
            inner, window = saved.extra, self._parent_window(trail)
        state = completed_state(self.inner, replace(saved, extra=inner), _inner_state(fresh), trail)
        return _with_window(state, window)

    def _parent_window(self, trail: CheckpointTrail) -> list[Params]:
        config, last = self.config, trail.last_round
        if config.placement == "before_server_optimizer":
            raise CheckpointError(
                f"{trail.path} holds no IMA window, and placement before_server_optimizer averages "
                f"the pure aggregates, which a checkpoint does not keep: branch from a run of this "
                f"IMA job (with an average_from past the branch round it equals its inner algorithm's "
                f"run), or use placement: after_server_update"
            )
        if last >= config.average_from:
            raise CheckpointError(
                f"{trail.path} ends after round {last}, but IMA starts at round {config.average_from}: "
                f"its window would hold rounds trained without IMA; branch from the checkpoint of "
                f"round {config.average_from - 1} or an earlier one"
            )
        rounds = range(max(0, last - config.window + 1), last + 1)
        try:
            return [dict(trail.state_after(r).params) for r in rounds]
        except CheckpointError as exc:
            raise CheckpointError(
                f"IMA fills its window with the parent's models of rounds {rounds[0]} to {last}: "
                f"{exc}; run the parent with engine.checkpoint_every: 1 (its checkpoints of the "
                f"{config.window} rounds before the branch are what IMA needs)"
            ) from exc


def mean_model(window: list[Params]) -> Params:
    """The uniform mean of the window's models, key by key (eq. 5)."""
    return {k: torch.stack([model[k] for model in window]).mean(0) for k in window[-1]}


def _aggregates_mean_delta(inner: Algorithm[Any]) -> TypeGuard[Algorithm[Params | None]]:
    """Whether the inner plugin's aggregate is the mean client delta itself."""
    return isinstance(inner.aggregator(), WeightedMean) and not callable(
        getattr(inner, "pseudo_gradient", None)
    )


def _inner_state(state: ServerState[IMAState[E]]) -> ServerState[E]:
    """The state the inner algorithm keeps: IMA's without the window."""
    return ServerState(state.params, state.opt_state, state.extra.inner, state.buffer_keys)


def _with_window(state: ServerState[E], window: list[Params]) -> ServerState[IMAState[E]]:
    """The inner algorithm's state with IMA's window beside its own."""
    return ServerState(state.params, state.opt_state, IMAState(state.extra, window), state.buffer_keys)
