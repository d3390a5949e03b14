"""Core value types shared by the engine, the backends and the plugins.

Sign convention (fixed for every plugin): ``delta = global - local``. A server steps on the
mean delta as if it were a gradient: ``global <- global - server_lr * mean_delta``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Protocol,
    TypeAlias,
    TypedDict,
    TypeVar,
    cast,
    runtime_checkable,
)

import numpy as np
import torch
from torch import nn
from typing_extensions import TypeVar as DefaultedTypeVar

from raysim.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from raysim.config.privacy import SamplePrivacy

ClientId = int
Params = dict[str, torch.Tensor]  # trainable tensors (and float buffers) by state-dict name
NumpyParams = dict[str, np.ndarray]  # what crosses the driver/worker boundary (zero-copy in Ray)
Metrics = dict[str, float]
# A client update's metrics: on a GPU the device-side sums stay 0-d tensors, read back once per
# worker round (``raysim.runtime.finite_checks``), so a client never waits for the card.
ClientMetrics = dict[str, "float | torch.Tensor"]
Split = Literal["train", "validation", "test"]  # validation: dataset.validation_fraction
Task = Literal["classification", "causal_lm", "regression"]
# What plugins send and keep: leaves (tensors, arrays, numbers, strings) in dicts, lists, tuples
# and dataclasses, all of which ``raysim.params`` walks. Updates and aggregates are trees of
# tensors, often a small frozen dataclass; state that is checkpointed holds no arrays or
# dataclasses (``params.check_loadable``).
Tree: TypeAlias = (
    "torch.Tensor | np.ndarray | float | str | None | Mapping[str, Tree] | Sequence[Tree] | DataclassInstance"
)
A_co = TypeVar("A_co", covariant=True)  # an aggregate type: what a plugin's aggregator results in
# A plugin's own state types (a frozen dataclass each, or None where it keeps none): what its
# payload carries (X), what a client keeps between rounds (S), what a client sends (U) and what
# the server keeps in ``ServerState.extra`` (E). Unparameterised, each reads as Any.
X = TypeVar("X")
S = TypeVar("S")
U = TypeVar("U")
E = TypeVar("E")
# what one client receives alone (``client_payload``, FedFomo's peers), which a plugin that sends it
# names: ``ClientContext[X, S, C]``; by default unchecked, so ``ClientContext[X, S]`` (every plugin
# that sends no such part) and a bare ``ClientContext`` (the worker's) keep meaning what they did
C = DefaultedTypeVar("C", default=Any)


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about the data it is built for.

    Attributes:
        task: "classification" (batch ``x`` -> logits (B, C)), "causal_lm" (tokens ``x`` (B, T)
            -> logits (B, T, V)) or "regression" (``x`` -> predictions (B, C) of float ``y`` (B, C)
            or (B,), mean squared error; accuracy is not defined and reads 0).
        input_shape: shape of one example's ``x``, e.g. (1, 28, 28) or (seq_len,).
        num_classes: classes for classification; the vocabulary size for causal LM; the number
            of outputs for regression.
        pad_token_id: token id that marks padding in text inputs, if any.
        metrics: scores ``evaluate`` adds beside loss and accuracy, by name ("mcc", "f1",
            "pearson"; ``raysim.measure.scores``), e.g. GLUE's for CoLA and STS-B.
    """

    task: Task
    input_shape: tuple[int, ...]
    num_classes: int
    pad_token_id: int | None = None
    metrics: tuple[str, ...] = ()


BatchTransform = Callable[[dict[str, torch.Tensor], int], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class ClientData:
    """One client's examples of one split, as numpy arrays with a shared first dimension.

    ``arrays["x"]`` has shape (n, *input_shape) (float32 images, int64 tokens) and
    ``arrays["y"]`` shape (n,), int64 for classification and float32 for regression.
    ``batch_transform(batch, step)``, when set, is what ``train_local`` makes of its ``step``-th
    training batch (``dataset.augment`` and ``dataset.poison``, ``raysim.data.augment``).
    """

    arrays: dict[str, np.ndarray]
    batch_transform: BatchTransform | None = None

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values()))) if self.arrays else 0


@dataclass(frozen=True)
class Payload(Generic[X]):
    """What every sampled client receives in a round: global params plus the plugin's extra.

    ``extra`` is the plugin's own frozen dataclass (None: nothing more), such as SCAFFOLD's
    server control variate or FedGuCci's anchor models; its fields hold numpy arrays or plain
    values in dicts, lists and tuples, and a client reads the arrays as tensors on its device
    (see ``ClientContext``). ``per_client`` maps a cohort client's id to a part for it alone (the
    plugin's ``client_payload``: FedFomo's peer models), which only the worker holding that
    client receives and which reaches it as ``ClientContext.client_payload``.
    """

    params: NumpyParams
    extra: X = None  # type: ignore[assignment]  # None: the plugin sends nothing more
    per_client: dict[int, Any] = field(default_factory=dict)  # client id -> its own part
    params_bytes: int | None = None  # what ``params`` weighs encoded (compression.download); None: whole


@dataclass(frozen=True)
class ClientContext(Generic[X, S, C]):
    """Everything a plugin's ``client_update`` may use; built by the worker for each client.

    The worker has already loaded ``payload.params`` into ``model`` (in train mode, no
    gradients); the plugin may change trainable values and float buffers freely because the
    worker restores them before the next client (see ``algorithm.py`` for the full contract).
    ``global_params`` is the broadcast on ``device``, moved there once per round for every client
    of the worker, and so are the arrays in ``payload.extra``: they arrive as tensors on
    ``device`` (``payload.params`` stays as sent). Read them, never write them.
    ``client_init()`` gives this client's own random initialisation: the job's model built afresh
    (its factory, under a seed drawn from the run seed and ``client_id``, so the same in every
    round and on every worker), as params on ``device``; the resident model and the torch random
    state are untouched. None where no worker builds the context (a unit test's).
    ``step_budget`` caps this client's local batches this round (a straggler that can do only
    part of its work, ``raysim.systems``; None: no cap): ``train_client`` honours it, and a
    plugin calling ``train_local`` itself passes it on.
    ``client_payload`` is this client's own part of the payload (``Payload.per_client``), its
    arrays as tensors on ``device``; None where the plugin sends none.
    ``model_section`` is the model section ({name: ..., **options}) of this client's architecture,
    which ``model`` is (``model_groups`` give clients different ones; {} in a unit test's context).
    ``model_of(client_id)`` is the worker's resident model of any client's architecture (FuseFL's
    towers): read its structure, copy it before changing it; None where no worker builds the context.
    ``sample_privacy`` is the job's ``privacy.sample`` (None: none): ``train_client`` and
    ``train_context`` then train with DP-SGD (``raysim.train.dp_sgd``); a plugin calling
    ``train_local`` itself passes it on. ``noise_salt`` is the job's (``raysim.config.job.noise_salt``),
    mixed into DP-SGD's noise seed so that two jobs never share noise.
    Frozen: a context is one client's view of one round; derive another with ``dataclasses.replace``.
    """

    client_id: ClientId
    round_num: int
    model: nn.Module
    payload: Payload[X]
    global_params: Params
    data: ClientData
    state: S | None  # this client's persistent state from earlier rounds, None the first time
    seed: int  # derived from (run seed, round_num, client_id)
    device: torch.device
    spec: DataSpec
    client_init: Callable[[], Params] | None = None
    step_budget: int | None = None
    client_payload: C | None = None
    model_section: dict[str, Any] = field(default_factory=dict)
    model_of: Callable[[ClientId], nn.Module] | None = None
    sample_privacy: SamplePrivacy | None = None
    noise_salt: int = 0


@dataclass(frozen=True)
class ClientResult(Generic[U, S]):
    """What one client sends back.

    Attributes:
        update: what the plugin's aggregator folds: a tree of tensors (a dict of them, or a small
            frozen dataclass of dicts of them).
        weight: aggregation weight: for the FedAvg family the examples trained on
            (``raysim.train.local.examples_trained_on``), FedNova's data size.
        metrics: small per-client numbers (loss, steps), averaged by the engine.
        state: new persistent state for this client (the plugin's frozen dataclass, its
            ``ClientState``); None keeps nothing.
    """

    update: U
    weight: float
    metrics: Mapping[str, float | torch.Tensor] = field(default_factory=dict)  # ClientMetrics
    state: S | None = None


class OptState(TypedDict, total=False):
    """A server optimizer's state (``server_opt.server_step``): its step count and moments."""

    step: int
    m: Params
    v: Params


@dataclass(frozen=True)
class ServerState(Generic[E]):
    """The server's state between rounds; saved in checkpoints (``raysim.checkpoint``).

    Attributes:
        params: global params (float32 CPU tensors).
        opt_state: server-optimizer state (moments), tensors by param name per slot.
        extra: the plugin's own state, a frozen dataclass (SCAFFOLD's control variate, IMA's
            window, FedGuCci's anchors), or None where it keeps none. A checkpoint holds it as
            the plain dict of its fields (``stored.plain``); resuming rebuilds it (``stored.rebuild``).
        buffer_keys: float buffers among ``params`` (BatchNorm statistics): averaged, never
            stepped on by a server optimizer.
    """

    params: Params
    opt_state: OptState = field(default_factory=OptState)
    extra: E = None  # type: ignore[assignment]  # None: the plugin keeps nothing more
    buffer_keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RunInfo:
    """Facts about the run a plugin may need when it builds its server state."""

    num_clients: int
    cohort_size: int
    num_rounds: int
    spec: DataSpec
    seed: int
    buffer_keys: frozenset[str] = frozenset()  # float buffers among the params (BN statistics)
    has_central_test: bool = True  # the dataset holds a central test set
    # the job's model and dataset sections ({name: ..., **options}): a plugin that composes models
    # of the job's (FuseFL's fused model) or keys a cache by the data (one-shot local models)
    model: dict[str, Any] = field(default_factory=dict)
    dataset: dict[str, Any] = field(default_factory=dict)
    # each population client's model section, in client-id order (``model_groups``); empty: every
    # client trains ``model``
    client_models: tuple[dict[str, Any], ...] = ()

    def model_of(self, client_id: int) -> dict[str, Any]:
        """The model section client ``client_id`` trains."""
        return self.client_models[client_id] if self.client_models else self.model

    @property
    def mixes_models(self) -> bool:
        """Clients train different architectures: no one parameter set fits them all."""
        return len({json.dumps(m, sort_keys=True, default=str) for m in self.client_models}) > 1


@dataclass(frozen=True)
class ClientFailure:
    """A client whose work raised (or produced a non-finite update); the driver applies the policy."""

    client_id: int
    position: int  # in the round's cohort
    error: BaseException
    stage: str = "client_update"  # or "update_check": the update held NaN or infinity
    raised_at: str = ""  # "file:line in function" of the plugin's own innermost frame (wire.raised_at)


@dataclass(frozen=True)
class WorkerTimes:
    """Where one worker's part of a round went, in seconds, measured in the worker; each phase
    apart from the ones it encloses (reading a client's data inside its training is data)."""

    busy_s: float = 0.0  # the whole call, these phases and the rest (metrics, checks)
    broadcast_s: float = 0.0  # the payload placed on the worker's device
    data_loading_s: float = 0.0  # clients' examples and stored state read, their new state written
    training_s: float = 0.0  # the plugin's client updates (and probes' hooks around them)
    reduce_s: float = 0.0  # results folded into the partial, the partial copied to the host
    gpu_max_allocated_bytes: int | None = None  # the round's peak (torch.cuda); None on a CPU


@dataclass(frozen=True)
class TrainedClient:
    """A client that trained: what the engine knows of it, kept apart from the plugin's metrics."""

    client_id: int
    weight: float  # its ``ClientResult.weight``
    seconds: float  # its client update's wall time
    metrics: Metrics = field(default_factory=dict)  # its ``ClientResult.metrics``, as returned


@dataclass(frozen=True)
class RoundOutput(Generic[A_co]):
    """A trained cohort: the merged aggregate plus what the engine reports about the round. A
    worker answers with its share of the round in the same shape (``raysim.runtime.wire.WorkerReport``:
    its partial as the aggregate, its own times), which the backend merges into this.

    Attributes:
        aggregate: the aggregator's ``result`` of the merged partials.
        clients: each client that trained, in worker order (``cohort_size`` counts the failed too).
        failures: clients dropped this round.
        probe_rows: per probe name, one row per client of what its worker hooks measured.
        local_models: client id -> the client's model after training, when asked to keep them.
        bytes_up: what the clients' updates weigh.
        params_up: the values (parameters) the clients' updates hold.
        client_peak_bytes: the most memory one client update added on its worker (CUDA peak
            allocation on a GPU, peak resident set growth on a CPU); None where none was measured
            (clients trained in vectorized chunks).
        worker_times: each worker's phases and busy time, in worker order.
        merge_s: the driver's merge of the workers' partials into the aggregate.
    """

    aggregate: A_co
    clients: list[TrainedClient] = field(default_factory=list)
    failures: list[ClientFailure] = field(default_factory=list)
    probe_rows: dict[str, list[Metrics]] = field(default_factory=dict)
    local_models: dict[int, NumpyParams] = field(default_factory=dict)
    bytes_up: int = 0
    params_up: int = 0
    client_peak_bytes: float | None = None
    worker_times: list[WorkerTimes] = field(default_factory=list)
    merge_s: float = 0.0

    @property
    def cohort_size(self) -> int:
        """The clients the cohort's payload went to: each of them either trained or failed."""
        return len(self.clients) + len(self.failures)


# ---- what plugins require of the model and the data ------------------------------------------


@runtime_checkable
class FeatureModel(Protocol):
    """A model that splits into features and a head: ``forward(x) == head(features(x))``.

    Every built-in model is one (``raysim.models.anatomy``); MOON, FedRoD and FedFA work on its
    features. Get one from a plugin's ``ctx.model`` with ``feature_model``.
    """

    @property
    def head(self) -> nn.Module:
        """The module mapping features to logits; its parameters are the model's own."""
        ...

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The head's input: (B, D) for classifiers, (B, T, D) for causal LMs."""
        ...


def feature_model(model: nn.Module, who: str) -> FeatureModel:
    """``model`` seen as a ``FeatureModel``, checked once (the plugin may then ``cast`` freely).

    Raises:
        TypeError: the model has no ``features(x)`` method or no ``head``; names ``who``.
    """
    # Not isinstance(model, FeatureModel): on Python 3.11 that evaluates the ``head`` property.
    if not callable(getattr(model, "features", None)) or not hasattr(model, "head"):
        raise TypeError(
            f"{who} needs a model with features(x) and head (raysim.types.FeatureModel), and "
            f"{type(model).__name__} has not: use a built-in model, or define both on yours"
        )
    return cast(FeatureModel, model)


def require_classification(spec_or_info: DataSpec | RunInfo, who: str, why: str) -> None:
    """Refuses a dataset whose task is not classification, at ``init``, before any training.

    Args:
        spec_or_info: the data's spec, or the run's facts (``RunInfo.spec``).
        who: what needs classes, e.g. "algorithm fedrod".
        why: what it does with them, and the fix if there is one.

    Raises:
        ConfigError: the task is not classification.
    """
    spec = spec_or_info.spec if isinstance(spec_or_info, RunInfo) else spec_or_info
    if spec.task != "classification":
        raise ConfigError([f"{who} needs a classification task, not the dataset's {spec.task!r}: {why}"])
