"""The engine's verbs, as a staged plugin (``protocol``) or a probe sees them, and the requests
they take.

A plugin whose method is not "R identical rounds" (FuseFL's stages, one-shot methods, LSS's
regimes) and a probe's driver-side summary drive the run through this narrow set of verbs, never
through the engine's internals. Every verb spreads its work over all workers.

Usage:
    def protocol(self, services: Services[Params | None], state: ServerState) -> ServerState:
        for round_num in range(services.start_round, services.info.num_rounds):
            state, metrics = services.run_round(state, round_num)
            services.end_round(state, round_num, metrics)
        return state

    cohort = services.cohort(0)  # a Metrics row (or None) per client of each point:
    [rows] = services.map_clients(MapRequest(EVALUATE, [P.to_numpy(state.params)], cohort))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

import numpy as np

from raysim import params as P
from raysim.errors import ConfigError
from raysim.private_sums import ClientClipping
from raysim.types import A_co, Metrics, NumpyParams, Payload, RoundOutput, RunInfo, ServerState

R = TypeVar("R")  # what ``map_clients`` gives for one point on one client


@dataclass(frozen=True)
class MapTask(Generic[R]):
    """What ``map_clients`` computes for a point on a client; ``R`` is that result's type."""

    name: Literal["evaluate", "logits", "features", "labels", "inputs"]


EVALUATE: MapTask[Metrics] = MapTask("evaluate")  # loss, accuracy, num_examples
LOGITS: MapTask[np.ndarray] = MapTask("logits")  # (n, ...) the model's outputs, example by example
FEATURES: MapTask[np.ndarray] = MapTask("features")  # (n, d) the model's ``features(x)``
LABELS: MapTask[np.ndarray] = MapTask("labels")  # (n,) the data's ``y``, to score LOGITS with
INPUTS: MapTask[np.ndarray] = MapTask("inputs")  # (n, ...) the data's ``x`` as models read it (FedDF)


@dataclass(frozen=True)
class MapRequest(Generic[R]):
    """``task`` for each parameter point on each client; checked when made, on the driver.

    Attributes:
        task: ``EVALUATE``, ``LOGITS``, ``FEATURES``, ``LABELS`` (to score ``LOGITS`` with a
            loss of one's own, e.g. IMA's squared error to one-hot) or ``INPUTS`` (the examples
            themselves, in the same order, for server-side training on them: FedDF).
        points: parameter sets, e.g. the round's local models or a grid of mixtures.
        clients: client ids, or None for the dataset's central test set (one result).
        split: "test", "train", "validation" (``dataset.validation_fraction``'s rows) or "round"
            (the client's capped training data of ``round_num``);
            with ``clients`` None, "triggered": the central test set with a poisoned job's
            trigger on its images whose label is not the trigger's, labelled with the trigger's
            (``dataset.poison``; accuracy there is the attack success rate; None unpoisoned).
        model: another model section (``{name: ..., **options}``) to load the points into, for a
            network the plugin composed itself (FuseFL's fused model); None: the job's.
        paired: point ``i`` on client ``i`` only (each client's own model on its own data: the
            "Local" baseline), one point per client, instead of every pair.
        store: a transfer dataset's name, "" the training data (the engine's evaluation).

    Raises:
        ConfigError: a split other than these, "round" without ``round_num``, "triggered" with
            clients, or ``paired``
            without one point per client (a ``model`` section that does not validate is refused
            by ``map_clients``, still on the driver).
    """

    task: MapTask[R]
    points: Sequence[NumpyParams]
    clients: Sequence[int] | np.ndarray | None
    split: str = "test"
    round_num: int | None = None
    model: dict[str, Any] | None = None
    paired: bool = False
    store: str = ""

    def __post_init__(self) -> None:
        # plain values that pickle once for every worker: numpy points, int client ids
        object.__setattr__(self, "points", tuple(P.to_numpy(p) for p in self.points))
        if self.clients is not None:
            object.__setattr__(self, "clients", tuple(int(c) for c in self.clients))
        check_map_request(self)

    @property
    def num_clients(self) -> int:
        """How many clients a point is evaluated on (the central test set counts as one)."""
        return 1 if self.clients is None else len(self.clients)


def check_map_request(request: MapRequest[Any]) -> None:
    """A request is refused on the driver, before any worker sees it (its ``model`` section is
    validated by the engine's ``map_clients``, against the registry)."""
    split = request.split
    splits = ("test", "train", "validation", "round", "triggered")
    if split not in splits or (split == "round" and request.round_num is None):
        raise ConfigError(
            [
                f"map_clients: split must be 'test', 'train', 'validation', 'round' (with a "
                f"round_num) or 'triggered' (clients None), got {split!r}"
            ]
        )
    if split == "triggered" and request.clients is not None:
        raise ConfigError(["map_clients: split 'triggered' is the central test set's: pass clients=None"])
    if request.paired and (request.clients is None or len(request.clients) != len(request.points)):
        raise ConfigError(["map_clients: paired needs one point per client (and clients, not None)"])


@dataclass(frozen=True)
class RoundOptions:
    """What a cohort's training is asked besides training: the probes due (their worker hooks
    run), whether every client's local model comes back, and the clients doing only part of
    their local work (client id -> local steps, i.e. batches), and central DP's clip bound where
    the job sets ``privacy.central`` (each contribution clipped on its worker), and whether every
    update is kept (``gathers``: a robust rule or ALIE reads them all, ``raysim.gathered_updates``),
    and the key under which a client's upload encoder reads its memory (the newest state kept before
    it), keeps its state and seeds every draw (its data, shuffling, dropout, noise, attack, encoder),
    where it is not the round (``state_keys``: an asynchronous client's launch index,
    ``raysim.engine.async_rounds``, whose plugins keep no state of their own; the plugin's round
    stays the model's version)."""

    probes: tuple[str, ...] = ()
    keep_local_models: bool = False
    step_budgets: dict[int, int] = field(default_factory=dict)
    clipping: ClientClipping | None = None
    gathers: bool = False
    state_keys: dict[int, int] = field(default_factory=dict)


class Services(Protocol[A_co]):
    """What a staged plugin or a probe may ask of the engine; ``raysim.engine.engine.Engine`` is
    one, handed over as itself (this protocol is what plugins are typed against).

    ``A_co`` is the plugin's aggregate type, the ``aggregate`` of ``train_cohort``'s output; a probe,
    which never trains, takes ``Services[object]``.

    A verb with many knobs takes one request value (``MapRequest``, ``RoundOptions``), written,
    checked and shipped to the workers once, not a keyword list repeated by every implementation.
    ``map_clients``' result type comes from its request's task (``MapRequest[R]`` gives ``R`` per
    point and client), so mypy knows Metrics rows for ``EVALUATE`` and arrays for ``LOGITS``,
    ``FEATURES`` and ``LABELS`` with neither overloads nor casts.
    """

    @property
    def info(self) -> RunInfo:
        """Facts about the run (clients, cohort size, rounds, data spec, seed)."""
        ...

    @property
    def start_round(self) -> int:
        """The first round this run executes: 0, or the round after a resumed checkpoint's."""
        ...

    def cohort(self, round_num: int) -> np.ndarray:
        """This round's client ids: the fixed schedule's, else a pure function of (seed, round)."""
        ...

    def train_cohort(
        self, payload: Payload, cohort: np.ndarray, round_num: int, options: RoundOptions = RoundOptions()
    ) -> RoundOutput[A_co]:
        """Runs ``client_update`` for each client and folds the results with the plugin's aggregator;
        applies the client failure policy. ``RoundOptions(keep_local_models=True)`` also returns
        every client's model."""
        ...

    def run_round(self, state: ServerState, round_num: int) -> tuple[ServerState, Metrics]:
        """One standard round (sample, broadcast, train, server update, probes when due)."""
        ...

    def round_metrics(self, output: RoundOutput[object], payload: Payload) -> Metrics:
        """A trained cohort's metrics, as the round loop logs them: the clients' own metrics averaged
        by client weight (``train/*``), what ``payload`` weighs over the cohort (``sys/bytes_down``,
        and per payload part ``sys/bytes_down/<part>``), what the updates weigh (``sys/bytes_up``)
        and the clients that failed (``sys/failed_clients``, ``sys/nonfinite_clients``)."""
        ...

    def evaluate(self, state: ServerState, round_num: int | None = None) -> Metrics:
        """The global model's evaluation (``eval/...``), personalization and transfer when due."""
        ...

    def evaluate_weights(
        self, points: Sequence[NumpyParams], sections: Sequence[dict[str, Any]] | None = None
    ) -> Metrics:
        """Any weights evaluated as the job's evaluation plan evaluates the global model (central
        test set, a poisoned job's triggered one, the plan's clients, their validation rows, the
        held-out clients; ``eval/...`` as ``evaluate`` logs them, without personalization): one
        point is a model, several an ensemble predicting by their mean raw logits (accuracy and
        cross-entropy). ``sections``: each point's model section (a network the plugin composed,
        FuseFL's fused model; the clients' architectures under ``model_groups``); None: the job's.
        """
        ...

    def map_clients(self, request: MapRequest[R]) -> list[list[R | None]]:
        """Each point of ``request`` on each of its clients (or the central test set), spread over
        all workers. An EVALUATE request's model, or a LOGITS request's P points taken together
        (an ensemble), is the predictor whose inference cost the next ``log`` with evaluation
        metrics records.

        Returns:
            ``results[p][c]`` for point ``p`` and client position ``c`` (``results[0][c]`` when
            ``paired``); None where the client has no examples in ``split``.
        """
        ...

    def is_eval_round(self, round_num: int) -> bool:
        """Whether evaluation is due after ``round_num`` (``evaluation.every``, and the last round):
        when ``end_round`` evaluates the global model, and when a plugin with models of its own
        (the "Local" baseline's per-client models) should evaluate them."""
        ...

    def end_round(self, state: ServerState, round_num: int, metrics: Metrics) -> Metrics:
        """What the round loop does after each round: evaluate when due (``evaluation.every``,
        personalization), log, checkpoint when due (``engine.checkpoint_every``); returns the
        metrics as logged. A staged plugin calls it (or ``log`` alone) after each of its rounds."""
        ...

    def log(self, metrics: Metrics, round_num: int) -> None:
        """Logs metrics at step ``round_num`` (MLflow, the run's history, the progress bar), with
        the cost of the cohorts trained and the predictor evaluated since the last log
        (``sys/client_*``, ``sys/params_*``, ``sys/inference_*``: ``raysim.engine.cost``); a
        metric the plugin logs itself under one of those names wins."""
        ...

    def checkpoint(self, state: ServerState, round_num: int) -> Path:
        """Saves the server state and a snapshot of the client state; returns the file."""
        ...
