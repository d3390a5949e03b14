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
- The driver's methods receive the run's facts (``RunInfo``) last: ``init(params, info)``,
  ``payload(state, round_num, info)``, ``client_payload(state, round_num, client_id, info)``,
  ``server_update(state, aggregate, round_num, info)``; so server state keeps no run fact (seed,
  population, sizes). Workers never see ``RunInfo``: they derive what they need from ``ctx.model``,
  ``ctx.spec`` and the payload. ``aggregator()`` runs on workers and driver.

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
  ``ClientContext[X, S]``, ``ClientResult[U, S]``; None where it keeps or sends nothing more;
  ``ClientContext[X, S, C]`` where it sends a ``client_payload`` of type C).
- Per-client persistent state goes in ``ClientResult.state`` and comes back as ``ctx.state``
  (None the first time), its type named by the class attribute ``ClientState``; it is kept
  outside the workers, so it survives worker restarts.
- Persistence: checkpoints and the client-state store are read back with a weights-only
  ``torch.load``, so they hold plain values only. A state dataclass crosses as the dict of its
  fields (``stored.plain``), whose fields hold tensors, numbers, strings and dicts / lists /
  tuples of them (anything else is refused when saved). Reading back, the worker rebuilds client
  state as ``ClientState`` (``stored.from_plain``), and resuming rebuilds ``ServerState.extra``
  after the one ``init`` made for this run (``stored.rebuild``; the engine's ``typed_like``): a
  checkpoint whose fields differ is refused, naming both (a plugin's ``resume_state`` may complete
  it first: another plugin's, an older one's). So a state field keeps its name across
  versions; the plain dicts that earlier versions saved under the same keys load as they are, and
  a field a later version drops is named in the dataclass's ``RETIRED_FIELDS``
  (``stored.retired_fields``): an older checkpoint that holds it resumes, the value unread.
- A plugin whose method is not "R identical rounds" (FuseFL's stages, one-shot methods) is a
  ``StagedAlgorithm``: ``Config``, ``client_update`` and ``protocol(services, state)``, which drives
  the engine through ``raysim.services``; ``init``, ``aggregator`` and ``payload`` are optional
  (``fresh_state``, ``aggregator_of``, ``first_payload`` say what stands in), and
  ``services.run_round`` needs every round-loop method. A plugin of neither shape is refused when
  the job builds it, before any worker starts, naming what it lacks (``check_shape``).
- Per-client architectures (the job's ``model_groups``) reach only a plugin whose class sets
  ``MIXED_MODELS = True`` (every other is refused when the job loads). It sends no ``params``:
  the worker restores each client's architecture's initial weights (the run seed's) instead;
  ``ctx.model`` is the client's architecture, ``ctx.model_section`` names it, and
  ``ctx.model_of(client_id)`` is any client's (read it, copy it before changing it); on the
  driver ``RunInfo.client_models`` / ``model_of`` / ``mixes_models`` say the same.
- ``sys/bytes_down`` counts the tensor and array leaves (inside dicts) of ``payload.params`` and
  of each ``payload.extra`` field (``sys/bytes_down/<field>``) once per cohort client, plus
  each client's own part (``sys/bytes_down/per_client``) once; ``sys/bytes_up`` those of every
  ``update``.

Every name the engine reads from a plugin, required or optional; each is read only through the
function named here: in ``raysim.plugin_defaults`` (which says what stands in where a plugin has
none), in ``raysim.config.plugins`` (what a job reads before anything is built: no torch) or in
this module (a hook's full contract is its Protocol's docstring, below):

name              read from   type                                             read by
----------------- ----------- ------------------------------------------------ ----------------------
Config            class       ``type[BaseModel]``: frozen, ``extra="forbid"``  ``registry.register``
init ... protocol instance    ``Algorithm`` / ``StagedAlgorithm``'s methods    ``check_shape`` ...
ClientState       class       the frozen dataclass of its client state         ``client_state_type``
MIXED_MODELS      class       ``bool`` (absent: False)                         ``accepts_mixed_models``
UPDATE_DELTA      class       ``str``: "" or the update's delta field          ``update_delta``
update_delta      Config      ``() -> str | None``: a wrapper's UPDATE_DELTA     ``update_delta``
DEFAULT_MODEL     class       ``Mapping[str, Any]``: a model section           ``default_model``
check_job         any Config  ``(job: JobCore) -> list[str]``: problems        ``job_problems``
check_model       Config      ``(model: nn.Module) -> list[str]``              ``model_problems``
sample_privacy_problem
                  Config      ``() -> str | None``: why DP-SGD cannot hold     ``sample_privacy_problem``
check_models      Config      ``(models: list[nn.Module], spec) -> list[str]`` ``models_problems``
local             Config      ``LocalTrainConfig``: the plain loop's SGD       ``local_section``
pseudo_gradient   instance    ``PseudoGradientAlgorithm``                      ``pseudo_gradient``
vectorized_update instance    ``VectorizedAlgorithm`` (or None)                ``vectorizes``
client_payload    instance    ``ClientPayloadAlgorithm``                       ``with_client_payloads``
personal_model    instance    ``PersonalAlgorithm``                            ``has_personal_model``
resume_state      instance    ``ResumingAlgorithm``                            ``resume_state``
RETIRED_FIELDS    state class ``ClassVar[frozenset[str]]``                     ``stored.retired_fields``
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeAlias, TypeGuard, TypeVar, runtime_checkable

from pydantic import BaseModel
from torch import nn

from raysim.aggregate import Aggregator
from raysim.checkpoint import CheckpointTrail
from raysim.services import Services
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState

A = TypeVar("A")  # the plugin's aggregate: what its aggregator results in, what server_update takes


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

    def payload(self, state: ServerState, round_num: int, info: RunInfo) -> Payload:
        """What every sampled client receives this round (driver)."""
        ...

    def client_update(self, ctx: ClientContext) -> ClientResult:
        """One client's local work (worker)."""
        ...

    def aggregator(self) -> Aggregator[A]:
        """How client results reduce; the same object type on every worker and the driver."""
        ...

    def server_update(
        self, state: ServerState, aggregate: A, round_num: int, info: RunInfo
    ) -> tuple[ServerState, Metrics]:
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


def plugin_hook(plugin: object, name: str) -> Callable[..., Any] | None:
    """``plugin.name`` where it is a method (a hook may be a property that is None)."""
    hook = getattr(plugin, name, None)
    return hook if callable(hook) else None


def has_protocol(algorithm: AnyAlgorithm[A]) -> TypeGuard[StagedAlgorithm]:
    """Whether the plugin replaces the round loop with its own protocol."""
    return plugin_hook(algorithm, "protocol") is not None


def runs_rounds(algorithm: AnyAlgorithm[A]) -> TypeGuard[Algorithm[A]]:
    """Whether the plugin defines the round loop's methods (a staged plugin may, too)."""
    return all(plugin_hook(algorithm, name) is not None for name in ROUND_LOOP_METHODS)


def check_shape(name: str, plugin: object) -> None:
    """Refuses a plugin that has neither shape, naming the methods it lacks (checked when the job's
    plugin is built, so a wrapper that delegates to an inner plugin has what the inner has).

    Raises:
        TypeError: neither every round-loop method nor ``protocol`` and ``client_update``.
    """
    required = STAGED_METHODS if plugin_hook(plugin, "protocol") is not None else ROUND_LOOP_METHODS
    missing = [method for method in required if plugin_hook(plugin, method) is None]
    if missing:
        raise TypeError(
            f"algorithm {name!r}: {type(plugin).__name__} lacks {', '.join(missing)}; a plugin defines "
            f"{', '.join(ROUND_LOOP_METHODS)} (the round loop), or protocol and client_update "
            f"(its own protocol; docs/writing-a-plugin.md)"
        )


# ---- the optional hooks ------------------------------------------------------------------------
class PseudoGradientAlgorithm(Algorithm[A], Protocol[A]):
    """An algorithm whose aggregate is not itself the round's mean delta."""

    def pseudo_gradient(self, aggregate: A) -> Params:
        """The round's mean delta (FedFish's Fisher-weighted sums, SCAFFOLD's sums); probes measure
        the pure aggregate ``global - pseudo_gradient`` with it."""
        ...


class VectorizedAlgorithm(Algorithm[A], Protocol[A]):
    """An algorithm whose client update also runs for a chunk of clients at once."""

    def vectorized_update(self, ctxs: list[ClientContext]) -> list[ClientResult]:
        """``client_update`` of every context, in order, trained together (``train_clients``) within
        float tolerance, on the resident model, which it leaves as loaded; ``engine.vectorize``
        decides whether a worker uses it. Where only some options vectorize, a property, else None."""
        ...


def vectorizes(algorithm: AnyAlgorithm[A]) -> TypeGuard[VectorizedAlgorithm[A]]:
    """Whether the plugin's client update can train a chunk of clients at once."""
    return plugin_hook(algorithm, "vectorized_update") is not None


class ClientPayloadAlgorithm(Algorithm[A], Protocol[A]):
    """An algorithm that sends each cohort client a part of the payload for it alone."""

    def client_payload(self, state: ServerState, round_num: int, client_id: int, info: RunInfo) -> object:
        """One cohort client's own part beside the shared ``payload`` (a frozen dataclass, arrays as
        in ``payload.extra``): FedFomo's peer models. A worker receives its own clients' parts only
        (``Payload.per_client``); ``client_update`` reads one as ``ctx.client_payload``."""
        ...


class PersonalAlgorithm(Algorithm[A], Protocol[A]):
    """An algorithm whose clients predict with a personal part kept in their state."""

    def personal_model(self, ctx: ClientContext) -> nn.Module:
        """The client's own predictor (``eval/personal/...``). ``ctx`` is as for training, its model
        loaded with the evaluated global params, ``state`` the newest up to then (None: never
        trained), ``data`` the whole train split; it returns ``ctx.model`` with the personal part
        applied or a module around it (FedRoD's two heads), as ``client_update`` may change it."""
        ...


def has_personal_model(algorithm: AnyAlgorithm[A]) -> TypeGuard[PersonalAlgorithm[A]]:
    """Whether the plugin's clients are evaluated with their state (``eval/personal/...``)."""
    return plugin_hook(algorithm, "personal_model") is not None


class ResumingAlgorithm(Algorithm[A], Protocol[A]):
    """An algorithm that completes a checkpoint's state another plugin or an older one wrote."""

    def resume_state(self, saved: ServerState, fresh: ServerState, trail: CheckpointTrail) -> ServerState:
        """``saved.extra`` is plain (the checkpoint's dict of fields, or {} / None), ``fresh`` is
        ``init``'s, ``trail`` the states beside the checkpoint (IMA fills its window from them)."""
        ...
