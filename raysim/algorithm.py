"""The algorithm plugin contract, stated here and nowhere else.

A plugin is one class in one file under ``algorithms/``, registered with
``@register("algorithm", name)``, holding both halves of an FL method (docs/writing-a-plugin.md
builds one, ``algorithms/fedavg_clip.py``):

driver   ``init`` -> per round: ``payload`` -> [workers: ``client_update`` folded by
         ``aggregator``] -> ``server_update``
worker   ``client_update(ctx)`` runs once per sampled client, on a resident model into which the
         worker has already loaded ``payload.params``.
staged   ``protocol(services, state)`` replaces the rounds (a ``StagedAlgorithm``, below); its
         ``services.train_cohort`` runs ``client_update`` on the workers as a round does.

Where each part runs:
- ``Config`` (a frozen pydantic model) is the job's ``algorithm:`` section less its ``name``.
- Every worker builds its own instance from the job config: nothing the driver sets on ``self``
  reaches ``client_update``. Round-varying data travels in ``Payload.extra`` or derives from
  ``ctx.round_num``.
- ``init(params, info)`` runs once, on the driver; workers never see ``RunInfo`` and derive what
  they need from ``ctx.model`` and ``ctx.spec``. ``aggregator()`` runs on workers and driver.

Rules every plugin follows:
- ``client_update`` may change the values of ``ctx.model``'s trainable parameters and float
  buffers freely: before the next client the worker copies ``payload.params`` (which covers
  exactly those) back in, sets train mode and clears gradients. Frozen parameters, integer
  buffers, modules, ``requires_grad`` and hooks it must leave as they were. It must not touch
  globals, trackers or Ray; its randomness comes from ``ctx.seed`` (the worker seeds torch with
  it first; draw your own from ``torch.Generator().manual_seed(ctx.seed)``).
- ``payload`` returns the round's ``Payload``; its ``params`` cover every tensor that travels
  (``params.model_params``: trainable parameters and float buffers), or none at all
  (``Payload({})``): then the worker loads nothing, and ``client_update`` must load every weight
  it trains from ``payload.extra`` itself, since the resident model holds whatever ran last on
  that worker (another client, an evaluation; a restarted worker rebuilds it from the seed).
  ``payload.extra`` (the plugin's frozen dataclass, or None) holds numpy arrays and plain values
  in dicts, lists and tuples (``params.numpy_leaves`` turns its tensors into arrays); its arrays
  reach ``client_update`` as tensors on ``ctx.device``, moved once per round per worker: read
  them, never write them.
- Aggregators are associative (``raysim.aggregate``): ``WeightedMean`` and ``Sum`` fold nested
  dicts of tensors with one structure for every client; ``Gather`` keeps results apart, as
  ``[(cohort position, ClientResult), ...]`` in cohort order.
- Metrics are returned, never logged by the plugin. Every numeric entry of
  ``ClientResult.metrics`` is averaged over the cohort (weighted by ``ClientResult.weight``) and
  logged under its own key; ``server_update``'s metrics are logged as returned.
- ``delta = global - local``; a server steps on the mean delta like a gradient.
- Plugin state is typed: each plugin declares frozen dataclasses for what it keeps in
  ``ServerState.extra``, sends in ``Payload.extra``, sends as ``ClientResult.update`` and keeps per
  client, and annotates its methods with them (``ServerState[E]``, ``Payload[X]``,
  ``ClientContext[X, S]``, ``ClientResult[U, S]``; None where it keeps or sends nothing more).
- Per-client persistent state goes in ``ClientResult.state`` and comes back as ``ctx.state``
  (None the first time); it is kept outside the workers, so it survives worker restarts. A plugin
  with client state names its type as the class attribute ``ClientState``.
- Persistence: checkpoints and the client-state store are read back with a weights-only
  ``torch.load``, so they hold plain values only. A state dataclass crosses as the dict of its
  fields (``stored.plain``), whose fields hold tensors, numbers, strings and dicts / lists /
  tuples of them (anything else is refused when saved). Reading back, the worker rebuilds client
  state as ``ClientState`` (``stored.from_plain``), and resuming rebuilds ``ServerState.extra``
  after the one ``init`` made for this run (``stored.rebuild``; the engine's ``typed_like``): a
  checkpoint whose fields differ is refused, naming both. So a state field keeps its name across
  versions; the plain dicts that earlier versions saved under the same keys load as they are.
- A plugin whose method is not "R identical rounds" (FuseFL's stages, one-shot methods) is a
  ``StagedAlgorithm``: it defines ``protocol(services, state)`` and drives the engine through
  ``raysim.services``. It must define ``Config``, ``client_update`` (the workers run it for the
  protocol's ``services.train_cohort``) and ``protocol``. The rest is optional, each with a
  default the engine uses instead: ``init`` (``fresh_state``: a copy of the initial params, no
  ``extra``), ``aggregator`` (``aggregator_of``: ``Gather``, so ``train_cohort``'s aggregate is
  ``[(cohort position, ClientResult), ...]``) and ``payload(state, 0)``, what its first cohort
  receives, with which a GPU worker's memory is measured (``first_payload``: the initial params,
  none with per-client architectures). ``server_update`` is only ever called by
  ``services.run_round``, which needs every round-loop method: a protocol that runs standard
  rounds defines them all. A plugin of neither shape is refused when the job builds it, before any worker
  starts, naming what it lacks (``check_shape``).
- Per-client architectures (the job's ``model_groups``) reach only a plugin whose class sets
  ``MIXED_MODELS = True`` (every other is refused when the job loads). It sends no ``params``:
  the worker restores each client's architecture's initial weights (the run seed's) instead;
  ``ctx.model`` is the client's architecture, ``ctx.model_section`` names it, and
  ``ctx.model_of(client_id)`` is any client's (read it, copy it before changing it); on the
  driver ``RunInfo.client_models`` / ``model_of`` / ``mixes_models`` say the same.
- ``raysim run --resume`` replaces ``init``'s state by the checkpoint's, which must hold the
  ``extra`` fields this plugin's ``init`` makes (a checkpoint of another plugin of the same family
  does; ``resume_state`` below completes any other).
- ``sys/bytes_down`` counts the tensor and array leaves (inside dicts) of ``payload.params`` and
  of each ``payload.extra`` field (``sys/bytes_down/<field>``) once per cohort client, plus
  each client's own part (``sys/bytes_down/per_client``) once; ``sys/bytes_up`` those of every
  ``update``.

Optional hooks, each used when present:
- ``pseudo_gradient(aggregate) -> Params``: the round's mean delta, when the aggregate is not
  itself that (FedFish's Fisher-weighted sums, SCAFFOLD's sums); probes measure the pure
  aggregate ``global - pseudo_gradient`` with it.
- ``vectorized_update(ctxs) -> list[ClientResult]``: ``client_update`` for a chunk of clients at
  once (``raysim.train.vectorized.train_clients``), each result what ``client_update(ctx)`` would
  return within float tolerance. Its presence declares that the plugin's client update
  vectorizes; ``engine.vectorize`` (off by default) decides whether the worker uses it. Every
  context shares the resident model, loaded with ``payload.params``, which the hook leaves as is.
  A plugin that vectorizes under some options only makes it a property, None under the others.
- ``client_payload(state, round_num, client_id) -> object``: a part of the round's payload for
  one cohort client alone (its frozen dataclass, arrays as in ``payload.extra``), beside the
  shared ``payload``: FedFomo sends each client the models of its own peers. The engine asks it
  for every client of the cohort (driver) and puts the parts in ``Payload.per_client``; a worker
  receives the shared part once per round and the parts of its own clients only, and
  ``client_update`` reads its part as ``ctx.client_payload``.
- ``personal_model(ctx) -> nn.Module``: the client's own predictor, for the evaluation that
  uses client state (``eval/personal/...``, on each evaluated training client's test split). The
  worker builds ``ctx`` as for training, with ``ctx.model`` loaded with the evaluated global
  params, ``ctx.payload`` holding those params alone, ``ctx.state`` the client's newest state up
  to the evaluated round (None: it never trained), ``ctx.data`` its whole train split (to
  fine-tune on) and ``ctx.seed`` a stream of its own. It returns ``ctx.model`` with the personal
  part applied (a head or BatchNorm layers loaded, a head fine-tuned) or a module around it
  (FedRoD's generic plus personal head); the worker restores the weights afterwards, as it does
  after ``client_update``, and the same rules hold.
- ``resume_state(saved, fresh, trail) -> ServerState``: completes a checkpoint's state written
  by an older plugin or another of its family; ``saved.extra`` is plain (the dict of fields the
  checkpoint holds, or {} / None), ``fresh`` is what ``init`` made for this run,
  ``trail`` a ``raysim.checkpoint.CheckpointTrail``: the earlier rounds' states beside the
  checkpoint (IMA branching from a FedAvg checkpoint fills its window with them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol, TypeAlias, TypeGuard, TypeVar, runtime_checkable

import torch
from pydantic import BaseModel
from torch import nn

from raysim import params as P
from raysim.aggregate import Aggregator, Gather, WeightedMean
from raysim.checkpoint import CheckpointTrail
from raysim.services import Services
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState

A = TypeVar("A")  # the plugin's aggregate: what its aggregator results in, what server_update takes
E = TypeVar("E")  # what the plugin keeps in ``ServerState.extra``


@runtime_checkable
class Algorithm(Protocol[A]):
    """Client and server halves of one FL method (see the module docstring for the contract).

    ``A`` is the method's aggregate type: FedAvg's ``Algorithm[Params | None]`` declares
    ``aggregator() -> WeightedMean[Params]`` and ``server_update(state, mean_delta: Params | None, ...)``.
    """

    # Read-only members are properties here, so that a plugin's class attribute ``Config =
    # FedOptConfig`` (a subclass) satisfies them; a plain attribute would have to match exactly.
    @property
    def Config(self) -> type[BaseModel]:
        """The plugin's own options: a frozen pydantic model, validated from the job's section."""
        ...

    def init(self, params: Params, info: RunInfo) -> ServerState:
        """The server state before round 0, from the initial global params."""
        ...

    def payload(self, state: ServerState, round_num: int) -> Payload:
        """What every sampled client receives this round (driver)."""
        ...

    def client_update(self, ctx: ClientContext) -> ClientResult:
        """One client's local work (worker)."""
        ...

    def aggregator(self) -> Aggregator[A]:
        """How client results reduce; the same object type on every worker and the driver."""
        ...

    def server_update(self, state: ServerState, aggregate: A, round_num: int) -> tuple[ServerState, Metrics]:
        """The new server state from the round's merged aggregate (the aggregator's result of
        no client at all when nobody reported: None for ``WeightedMean`` and ``Sum``)."""
        ...


class StagedAlgorithm(Protocol):
    """An algorithm that replaces the round loop with its own protocol (FuseFL, one-shot): its
    options, its clients' work and the protocol; ``init``, ``aggregator`` and ``payload`` only where
    it needs its own (``fresh_state``, ``aggregator_of``, ``first_payload``)."""

    @property
    def Config(self) -> type[BaseModel]:
        """The plugin's own options: a frozen pydantic model, validated from the job's section."""
        ...

    def client_update(self, ctx: ClientContext) -> ClientResult:
        """One client's local work (worker), run by the protocol's ``services.train_cohort``."""
        ...

    def protocol(self, services: Services[Any], state: ServerState) -> ServerState:
        """Runs the whole method with the engine's verbs; returns the final server state."""
        ...


# either shape of plugin: the round loop's methods, or its own protocol
AnyAlgorithm: TypeAlias = Algorithm[A] | StagedAlgorithm
ROUND_LOOP_METHODS = ("init", "payload", "client_update", "aggregator", "server_update")
STAGED_METHODS = ("client_update", "protocol")


def has_protocol(algorithm: AnyAlgorithm[A]) -> TypeGuard[StagedAlgorithm]:
    """Whether the plugin replaces the round loop with its own protocol."""
    return callable(getattr(algorithm, "protocol", None))


def runs_rounds(algorithm: AnyAlgorithm[A]) -> TypeGuard[Algorithm[A]]:
    """Whether the plugin defines the round loop's methods (a staged plugin may, too)."""
    return all(callable(getattr(algorithm, name, None)) for name in ROUND_LOOP_METHODS)


def check_shape(name: str, plugin: object) -> None:
    """Refuses a plugin that has neither shape, naming the methods it lacks (checked when the job's
    plugin is built, so a wrapper that delegates to an inner plugin has what the inner has).

    Raises:
        TypeError: neither every round-loop method nor ``protocol`` and ``client_update``.
    """
    required = STAGED_METHODS if callable(getattr(plugin, "protocol", None)) else ROUND_LOOP_METHODS
    missing = [method for method in required if not callable(getattr(plugin, method, None))]
    if missing:
        raise TypeError(
            f"algorithm {name!r}: {type(plugin).__name__} lacks {', '.join(missing)}; a plugin defines "
            f"{', '.join(ROUND_LOOP_METHODS)} (the round loop), or protocol and client_update "
            f"(its own protocol; docs/writing-a-plugin.md)"
        )


def init_state(params: Params, info: RunInfo, extra: E) -> ServerState[E]:
    """The server state before round 0: a copy of ``params``, no optimizer moments yet, and the
    plugin's own ``extra`` (None where it keeps nothing more). Every fresh state is built here:
    a plugin's ``init`` calls it (``raysim.train.server_opt`` re-exports it), as ``fresh_state`` does."""
    return ServerState(params=P.clone(params), buffer_keys=info.buffer_keys, extra=extra)


def fresh_state(algorithm: AnyAlgorithm[A], params: Params, info: RunInfo) -> ServerState:
    """The server state before round 0: the plugin's ``init``; else (a staged plugin without
    one) a copy of the initial params and nothing more."""
    hook = getattr(algorithm, "init", None)
    if callable(hook):
        state: ServerState = hook(params, info)
        return state
    return init_state(params, info, None)


def first_payload(algorithm: AnyAlgorithm[A], state: ServerState, info: RunInfo) -> Payload:
    """What the first cohort receives: the plugin's ``payload`` of round 0; else (a staged plugin
    without one) the initial params, or none where clients start from their own architectures."""
    hook = getattr(algorithm, "payload", None)
    if callable(hook):
        payload: Payload = hook(state, 0)
        return payload
    return Payload({} if info.mixes_models else P.to_numpy(state.params))


def aggregator_of(algorithm: AnyAlgorithm[A]) -> Aggregator[Any]:
    """How ``train_cohort`` folds client results: the plugin's ``aggregator``; else (a staged
    plugin without one) ``Gather``, every result kept for the protocol to read."""
    hook = getattr(algorithm, "aggregator", None)
    if callable(hook):
        aggregator: Aggregator[Any] = hook()
        return aggregator
    return Gather()


def with_client_payloads(
    algorithm: Algorithm[A], payload: Payload, state: ServerState, round_num: int, cohort: Iterable[int]
) -> Payload:
    """The round's payload with each cohort client's own part (the plugin's ``client_payload``
    hook); the payload as it is for a plugin without one."""
    hook = getattr(algorithm, "client_payload", None)
    if not callable(hook):
        return payload
    return replace(payload, per_client={int(c): hook(state, round_num, int(c)) for c in cohort})


class PersonalAlgorithm(Algorithm[A], Protocol[A]):
    """An algorithm whose clients predict with a personal part kept in their state."""

    def personal_model(self, ctx: ClientContext) -> nn.Module:
        """The client's own predictor from the global model and its state (see the module docstring)."""
        ...


def has_personal_model(algorithm: AnyAlgorithm[A]) -> TypeGuard[PersonalAlgorithm[A]]:
    """Whether the plugin's clients are evaluated with their state (``eval/personal/...``)."""
    return callable(getattr(algorithm, "personal_model", None))


class VectorizedAlgorithm(Algorithm[A], Protocol[A]):
    """An algorithm whose client update also runs for a chunk of clients at once."""

    def vectorized_update(self, ctxs: list[ClientContext]) -> list[ClientResult]:
        """``client_update`` of every context, in order, trained together."""
        ...


def vectorizes(algorithm: AnyAlgorithm[A]) -> TypeGuard[VectorizedAlgorithm[A]]:
    """Whether the plugin's client update can train a chunk of clients at once."""
    return callable(getattr(algorithm, "vectorized_update", None))


def pseudo_gradient(algorithm: AnyAlgorithm[A], aggregate: A, params: Params) -> Params | None:
    """The round's pseudo-gradient (mean ``global - local``): the plugin's ``pseudo_gradient`` hook;
    else, for a ``WeightedMean`` aggregator (a weighted mean of deltas is a mean delta), the
    aggregate itself when its tensors are keyed like ``params``; else None (no pure aggregate)."""
    if aggregate is None:
        return None
    hook = getattr(algorithm, "pseudo_gradient", None)
    if callable(hook):
        return hook(aggregate)
    if (
        isinstance(aggregator_of(algorithm), WeightedMean)
        and isinstance(aggregate, dict)
        and aggregate
        and set(aggregate) <= set(params)
        and all(isinstance(v, torch.Tensor) for v in aggregate.values())
    ):
        return aggregate
    return None


def pure_aggregate(params: Params, pseudo_grad: Params) -> Params:
    """``params - pseudo_grad`` where the pseudo-gradient has an entry: server SGD with lr 1."""
    return {k: (w - pseudo_grad[k].to(w)) if k in pseudo_grad else w for k, w in params.items()}


def resume_state(
    algorithm: AnyAlgorithm[A], saved: ServerState, fresh: ServerState, trail: CheckpointTrail
) -> ServerState:
    """The state a resumed run starts from: the plugin's ``resume_state(saved, fresh, trail)``
    hook; else the checkpoint's state as saved."""
    hook = getattr(algorithm, "resume_state", None)
    return hook(saved, fresh, trail) if callable(hook) else saved
