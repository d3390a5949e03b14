"""The job's own sections: the round loop, resources, tracking and evaluation (``raysim.config.job``
puts them together); and the dataset's training-time options, augmentation and poisoning, which
every recipe's config carries (``raysim.data.store.DatasetConfig``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, Field, field_validator

from raysim.config.asynchrony import AsynchronyConfig
from raysim.config.plugins import PluginSection
from raysim.config.selection import SelectionConfig

# The stores raysim logs to, by URI scheme. Others fail deep in MLflow; MLflow 3 refuses its file
# store ("", "file": a folder of runs) unless told to, and raysim keeps artifacts beside a database.
TRACKING_SCHEMES = frozenset({"sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks"})
STORE_FORMS = "sqlite:///path/mlflow.db or an MLflow server's http(s):// address"


def tracking_uri_problem(uri: str) -> str | None:
    """Why raysim cannot use ``uri`` as its MLflow store (a file store, a malformed SQLite URI, an
    unknown scheme), or None. The same rule for the job's key, MLFLOW_TRACKING_URI and the
    commands' ``--tracking-uri``."""
    if uri == "databricks":  # MLflow's name for the default Databricks profile
        return None
    scheme = urlsplit(uri).scheme.split("+")[0]  # postgresql+psycopg2
    if scheme in ("", "file"):
        return (
            f"{uri} is MLflow's file store (a folder of runs), which MLflow 3 no longer develops "
            f"and raysim does not log to; use {STORE_FORMS} (`mlflow migrate-filestore` moves "
            f"its runs into a database)"
        )
    if scheme == "sqlite" and not (uri.startswith("sqlite:///") and len(uri) > len("sqlite:///")):
        return (
            f"{uri} is no SQLite URI: write sqlite:///relative/path.db or "
            f"sqlite:////absolute/path.db (three slashes, then the path)"
        )
    if scheme not in TRACKING_SCHEMES:
        return (
            f"MLflow has no store for the scheme {scheme!r} ({uri}); use {STORE_FORMS} (or a "
            f"database server's postgresql://, mysql:// or mssql:// address)"
        )
    return None


def _yaml_on_off(mode: Any) -> Any:
    """YAML reads a bare ``on`` or ``off`` (in a file or a ``key=value`` override) as a boolean."""
    return {True: "on", False: "off"}.get(mode, mode) if isinstance(mode, bool) else mode


# A switch with a default that decides for itself (auto), or is forced on or off.
OnOffAuto = Annotated[Literal["auto", "on", "off"], BeforeValidator(_yaml_on_off)]


class EngineConfig(BaseModel, frozen=True, extra="forbid"):
    """The round loop."""

    num_rounds: int = Field(10, ge=1)
    cohort_size: int = Field(10, ge=1)
    max_failed_clients: int = Field(0, ge=0)  # per round; more stop the run, as a round of all failed does
    max_client_examples: int | None = Field(None, ge=1)  # per client per round: a seeded subset
    schedule: str | None = None  # a cohorts.json from an earlier run: the same participation
    # fixed: exactly cohort_size clients a round, uniformly without replacement; poisson: each
    # training client with probability cohort_size / population, so cohorts vary in size (what a
    # privacy accountant's amplification by sampling assumes, docs/privacy.md)
    sampling: Literal["fixed", "poisson"] = "fixed"
    selection: SelectionConfig | None = None  # None: uniform; oort, power_of_choice (docs/systems.md)
    asynchrony: AsynchronyConfig | None = None  # None: synchronous; fedbuff, fedasync (docs/systems.md)
    checkpoint_every: int = Field(0, ge=0)  # 0: only the final checkpoint
    # Train a worker's clients in chunks at once (raysim.train.vectorized): off (the sequential
    # loop, bit for bit as before), auto (where the plugin and model allow), on (or refuse the job).
    vectorize: OnOffAuto = "off"
    # Clients trained at once; auto: as many as the worker's memory holds, measured on its first
    # chunks (raysim.runtime.chunks.ChunkSize). Either way halved when a chunk runs out of memory.
    vectorize_chunk: int | Literal["auto"] = 16

    @property
    def clients_per_round(self) -> int:
        """The client updates a round trains: ``cohort_size``, or an asynchronous step's arrivals."""
        return self.cohort_size if self.asynchrony is None else self.asynchrony.updates_per_step

    @field_validator("vectorize_chunk", mode="plain")
    @classmethod
    def _clients_or_auto(cls, chunk: Any) -> int | Literal["auto"]:
        if chunk == "auto" or (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1):
            return chunk
        raise ValueError("must be a number of clients (1 or more) or auto")


class ResourcesConfig(BaseModel, frozen=True, extra="forbid"):
    """Where clients train: in-process (``serial``) or on Ray worker actors."""

    backend: Literal["ray", "serial"] = "ray"
    num_workers: int | None = Field(None, ge=1)  # None: one per CPU (or GPU slot) available
    cpus_per_worker: float = Field(1.0, gt=0)
    # A fraction shares one GPU between workers; auto: measured, one worker's training on a GPU
    # before the pool starts, as many workers per card as its peak fits (raysim.runtime.gpu_sizing)
    gpus_per_worker: float | Literal["auto"] = 0.0
    address: str | None = None  # Ray cluster address; None: RAY_ADDRESS, else a local Ray
    max_worker_restarts: int = Field(3, ge=0)
    # A lost worker (its node gone) whose resources no node offers any more leaves the pool after
    # this long; Ray alone would wait for them forever. Raise it when an autoscaler replaces nodes.
    restart_timeout_s: float = Field(60.0, gt=0)
    # How the workers' reservations (a Ray placement group) spread over a cluster's nodes.
    placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    # Stores a worker's node cannot read at the driver's path: sent through Ray's object store
    # (auto: only those; always: every store, to every worker) or refused (never).
    ship_data: Literal["auto", "always", "never"] = "auto"
    # The local update's arithmetic: fp32, or bf16 autocast (matrix products in bfloat16, the
    # weights and their updates in float32), for language models on GPUs that have bf16.
    precision: Literal["fp32", "bf16"] = "fp32"
    # torch.use_deterministic_algorithms in every worker (and CUBLAS_WORKSPACE_CONFIG on CUDA):
    # the same job gives the same model on a GPU too, slower; an op with no such kernel raises.
    deterministic: bool = False

    @field_validator("placement", mode="before")
    @classmethod
    def _strategy_name(cls, placement: Any) -> Any:
        return placement.upper() if isinstance(placement, str) else placement  # spread == SPREAD

    @field_validator("gpus_per_worker", mode="plain")
    @classmethod
    def _schedulable(cls, gpus: Any) -> float | Literal["auto"]:
        if gpus == "auto":
            return gpus
        if isinstance(gpus, bool) or not isinstance(gpus, int | float) or not 0 <= gpus <= 1:
            # a worker drives one device; Ray refuses fractions above 1
            raise ValueError(
                "must be auto (measured) or a share of one GPU from 0 to 1 (a worker uses one GPU; "
                "share one with fractions)"
            )
        return float(gpus)

    @property
    def gpu_share(self) -> float:
        """``gpus_per_worker`` as a number: ``auto`` is measured and replaced before any worker
        starts (``raysim.runtime.gpu_sizing``), so code that places or builds workers reads this."""
        if self.gpus_per_worker == "auto":
            raise ValueError("resources.gpus_per_worker: auto is measured before the workers start")
        return self.gpus_per_worker


class TrackingConfig(BaseModel, frozen=True, extra="forbid"):
    """MLflow logging, from the driver only."""

    enabled: bool = True
    experiment: str = "raysim"
    run_name: str | None = None  # default: job name
    tracking_uri: str | None = None  # default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    log_checkpoint: bool = True
    progress: bool = True  # console progress bar
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("tracking_uri")
    @classmethod
    def _known_scheme(cls, uri: str | None) -> str | None:
        problem = tracking_uri_problem(uri) if uri is not None else None
        if problem:
            raise ValueError(problem)
        return uri


class PersonalizationConfig(BaseModel, frozen=True, extra="forbid"):
    """Few-shot personalization of held-out clients (FedFish paper, Sec. 5.2.2, App. A.3).

    Each evaluated client fine-tunes a copy of the global model on the first ``fraction`` of its
    data (taken from its train split, which the store shuffled with a seed) and is evaluated on
    its test split, the same examples as the global evaluation.
    """

    fractions: list[float] = Field(default_factory=lambda: [0.25, 0.5])
    epochs: int = Field(1, ge=1)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(10, ge=1)
    every: int = Field(0, ge=0)  # rounds between personalizations; 0: after the last round only
    # smaller clients are skipped (the paper filters C4 at 4), on every evaluation of the clients
    # that are personalized, so that their eval/... metrics always average the same clients
    min_examples: int = Field(4, ge=1)

    @field_validator("fractions")
    @classmethod
    def _in_unit_interval(cls, fractions: list[float]) -> list[float]:
        if any(not 0 < f < 1 for f in fractions):
            raise ValueError("each fraction must be in (0, 1)")
        return fractions

    def admits(self, num_train: Any, num_test: Any) -> Any:
        """Whether a client with these split sizes is personalized (and so evaluated at all):
        it needs a test split and ``min_examples`` examples. Takes ints or numpy arrays."""
        return (num_test > 0) & (num_train + num_test >= self.min_examples)


class TransferConfig(BaseModel, frozen=True, extra="forbid"):
    """Another dataset the global model is evaluated (and personalized) on, e.g. C4 -> Stack
    Overflow. Its data must look like the training data to the model (same task and shape)."""

    name: str  # metrics go to eval/transfer/<name>/...
    dataset: dict[str, Any]  # a dataset section: {name: <recipe>, ...options}
    eval_clients: int | None = Field(None, ge=1)
    personalize: bool = True


class TimeToTargetConfig(BaseModel, frozen=True, extra="forbid"):
    """Log the round (and the simulated clock) at which an evaluated metric first reaches each of
    ``values``: it rises to them, or falls to them with ``at_most`` (a loss)."""

    metric: str = "eval/central/accuracy"
    values: list[float] = Field(min_length=1)
    at_most: bool = False

    @field_validator("metric")
    @classmethod
    def _evaluated(cls, metric: str) -> str:
        if not metric.startswith("eval/"):
            raise ValueError("must be an evaluation metric, eval/... (e.g. eval/central/accuracy)")
        return metric


class EvaluationConfig(BaseModel, frozen=True, extra="forbid"):
    """When and on what the model is evaluated, and the probes that ride along with rounds.

    The global model is evaluated after every ``every``-th round and after the last (and before
    round 0 with ``at_start``): on the central test set, on the test splits of ``clients``
    training clients, and on ``heldout_clients`` of the held-out clients (``heldout_fraction`` of
    the population, never trained). Probes (``raysim.measure.barrier``) measure rounds as they happen.
    """

    every: int = Field(10, ge=0)  # 0: evaluate only after the last round
    at_start: bool = False  # also evaluate the initial model (logged at step -1)
    clients: int | None = Field(None, ge=1)  # training clients whose test split is evaluated; None: all
    batch_size: int = Field(512, ge=1)
    heldout_fraction: float = Field(0.0, ge=0, lt=1)  # clients kept out of training, for evaluation
    heldout_clients: int | None = Field(None, ge=1)  # a seeded subset of them is evaluated
    personalization: PersonalizationConfig | None = None
    transfer: list[TransferConfig] = Field(default_factory=list)
    probes: list[PluginSection] = Field(default_factory=list)  # {name: <probe>, every: k, ...options}
    time_to_target: TimeToTargetConfig | None = None  # the round (and sim time) a metric reaches values


class AugmentConfig(BaseModel, frozen=True, extra="forbid"):
    """Augmentation of image clients' training batches (``dataset.augment``): a random crop of
    the image padded by ``crop_padding`` black pixels on each side, then a horizontal flip with
    probability 1/2, drawn per image from (run seed, round, client, batch) (``raysim.data.augment``)."""

    crop_padding: int = Field(4, ge=0)  # 0: no crop
    flip: bool = True


class PoisonConfig(BaseModel, frozen=True, extra="forbid"):
    """A backdoor on chosen clients' training images (``dataset.poison``, ``raysim.data.poison``).

    A ``trigger_size`` square shape, chosen by a label index (FuseFL's shapes: 0 circle, 1
    triangle, 2 square, 3 ellipse, 4 star, 5 diamond, 6 heart, 7 cross, 8 pentagon, 9 hexagon,
    then again), is drawn in a random colour at a random position on ``fraction`` of each batch
    of ``clients``, after augmentation. With ``target`` the shape is the target's and the labels
    become ``target`` (a backdoor attack); without it the shape is the image's own label's and
    the labels stay (FuseFL's label-correlated spurious feature).
    """

    clients: list[int] = Field(min_length=1)  # the poisoned client ids
    fraction: float = Field(1.0, gt=0, le=1)  # of each of their training batches
    target: int | None = Field(None, ge=0)  # None: labels kept, the shape follows each label
    trigger_size: int = Field(10, ge=1)  # the shape's side in pixels

    @field_validator("clients")
    @classmethod
    def _distinct_ids(cls, clients: list[int]) -> list[int]:
        if any(c < 0 for c in clients):
            raise ValueError("client ids start at 0")
        return sorted(set(clients))
