"""The engine's verbs, as a staged plugin (``protocol``) or a probe sees them.

A plugin whose method is not "R identical rounds" (FuseFL's stages, one-shot methods, LSS's
regimes) and a probe's driver-side summary drive the run through this narrow set of verbs, never
through the engine's internals. Every verb spreads its work over all workers.

Usage:
    def protocol(self, services: Services[Params | None], state: ServerState) -> ServerState:
        for round_num in range(services.start_round, services.info.num_rounds):
            state, metrics = services.run_round(state, round_num)
            services.end_round(state, round_num, metrics)
        return state
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol, overload

import numpy as np

from raysim.types import A_co, Metrics, NumpyParams, Payload, RoundOutput, RunInfo, ServerState


class Services(Protocol[A_co]):
    """What a staged plugin or a probe may ask of the engine.

    ``A_co`` is the plugin's aggregate type, the ``aggregate`` of ``train_cohort``'s output; a probe,
    which never trains, takes ``Services[object]``.
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
        self, payload: Payload, cohort: np.ndarray, round_num: int, *, keep_local_models: bool = False
    ) -> RoundOutput[A_co]:
        """Runs ``client_update`` for each client and folds the results with the plugin's aggregator;
        applies the client failure policy. ``keep_local_models`` also returns every client's model."""
        ...

    def run_round(self, state: ServerState, round_num: int) -> tuple[ServerState, Metrics]:
        """One standard round (sample, broadcast, train, server update, probes when due)."""
        ...

    def evaluate(self, state: ServerState, round_num: int | None = None) -> Metrics:
        """The global model's evaluation (``eval/...``), personalization and transfer when due."""
        ...

    @overload
    def map_clients(
        self,
        task: Literal["evaluate"],
        points: Sequence[NumpyParams],
        clients: Sequence[int] | np.ndarray | None,
        *,
        split: str = "test",
        round_num: int | None = None,
        model: dict[str, object] | None = None,
        paired: bool = False,
    ) -> list[list[Metrics | None]]:
        """Each parameter point on each client, spread over all workers.

        Args:
            task: "evaluate" (a Metrics row per client: loss, accuracy, num_examples), "logits" or
                "features" (an array per client: (n, ...) model outputs, or the model's
                ``features(x)``), or "labels" (the data's ``y``, to score "logits" with a loss
                of one's own, e.g. IMA's squared error to one-hot).
            points: parameter sets (numpy), e.g. the round's local models or a grid of mixtures.
            clients: client ids, or None for the dataset's central test set (one result).
            split: "test", "train" or "round" (the client's capped training data of
                ``round_num``).
            model: another model section (``{name: ..., **options}``) to load the points into,
                for a network the plugin composed itself (FuseFL's fused model); None: the job's.
            paired: point ``i`` on client ``i`` only (each client's own model on its own data:
                the "Local" baseline), one point per client, instead of every pair.

        Returns:
            ``results[p][c]`` for point ``p`` and client position ``c`` (``results[0][c]`` when
            ``paired``); None where the client has no examples in ``split``.
        """
        ...

    @overload
    def map_clients(
        self,
        task: Literal["logits", "features", "labels"],
        points: Sequence[NumpyParams],
        clients: Sequence[int] | np.ndarray | None,
        *,
        split: str = "test",
        round_num: int | None = None,
        model: dict[str, object] | None = None,
        paired: bool = False,
    ) -> list[list[np.ndarray | None]]: ...

    def end_round(self, state: ServerState, round_num: int, metrics: Metrics) -> Metrics:
        """What the round loop does after each round: evaluate when due (``evaluation.every``,
        personalization), log, checkpoint when due (``engine.checkpoint_every``); returns the
        metrics as logged. A staged plugin calls it (or ``log`` alone) after each of its rounds."""
        ...

    def log(self, metrics: Metrics, round_num: int) -> None:
        """Logs metrics at step ``round_num`` (MLflow, the run's history, the progress bar)."""
        ...

    def checkpoint(self, state: ServerState, round_num: int) -> Path:
        """Saves the server state and a snapshot of the client state; returns the file."""
        ...
