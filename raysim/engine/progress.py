"""The console progress bar: round, phase (start-up, training, evaluating, personalizing),
latest accuracy, elapsed time, ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from raysim.types import Metrics

_SHOWN = ("eval/central/accuracy", "eval/clients/accuracy", "train/accuracy")
PHASES = ("start-up", "training", "evaluating", "personalizing", "finishing")


class RoundProgress:
    """``with RoundProgress(name, num_rounds) as p: p.phase("training"); p.update(round_num, metrics)``.

    The bar starts before the run is built, so the minutes a first run spends preparing data and
    starting workers show as the ``start-up`` phase rather than as a silent console.
    """

    def __init__(
        self,
        name: str,
        num_rounds: int,
        start_round: int = 0,
        enabled: bool = True,
        console: Console | None = None,
    ) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[rounds]}"),
            TextColumn("{task.fields[phase]:<13}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            disable=not enabled,
            transient=False,
        )
        self.num_rounds, self.start_round = num_rounds, start_round
        # the bar counts this run's rounds (a resumed run's earlier ones would skew the ETA)
        self.task = self.progress.add_task(
            name, total=num_rounds - start_round, status="", phase=PHASES[0], rounds=self._rounds(start_round)
        )
        self.last: dict[str, float] = {}
        self.steps = False  # a staged plugin's own protocol: steps it logs, not the job's rounds

    def __enter__(self) -> RoundProgress:
        self.progress.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and self.current_phase == "start-up":  # the error says it all
            self.progress.update(self.task, visible=False)
        self.progress.stop()

    @property
    def current_phase(self) -> str:
        return str(self.progress.tasks[0].fields["phase"])

    def phase(self, name: str) -> None:
        """Shows what the run is doing now (one of ``PHASES``)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; one of {PHASES}")
        self.progress.update(self.task, phase=name)

    def resume_at(self, start_round: int, num_rounds: int | None = None) -> None:
        """A resumed run's bar starts at the checkpoint's round, and a run a privacy budget stops
        early ends at its last round (both known once the run is built)."""
        self.start_round = start_round
        self.num_rounds = num_rounds if num_rounds is not None else self.num_rounds
        self.progress.update(self.task, total=self.num_rounds - start_round, rounds=self._rounds(start_round))

    def staged(self) -> None:
        """A staged plugin (FuseFL's stages, a one-shot method's training and distillation) runs
        its own steps, however many ``engine.num_rounds`` says: the bar counts the steps it logs,
        with no total (so no ETA) until the run ends."""
        self.steps = True
        self.progress.update(self.task, total=None, completed=0, rounds="step -")

    def update(self, round_num: int, metrics: Metrics) -> None:
        """A round (a staged plugin's step) logged ``metrics``."""
        self.last.update({k: v for k, v in metrics.items() if k in _SHOWN})
        shown = next((f"{k.split('/')[-2]} acc {self.last[k]:.3f}" for k in _SHOWN if k in self.last), "")
        if self.steps:
            done = int(self.progress.tasks[0].completed) + 1
            self.progress.update(self.task, completed=done, status=shown, rounds=f"step {round_num}")
            return
        self.progress.update(
            self.task,
            completed=round_num + 1 - self.start_round,
            status=shown,
            rounds=self._rounds(round_num + 1),
        )

    def finished(self) -> None:
        """The run's steps are done: a staged plugin's bar fills."""
        if self.steps:
            done = self.progress.tasks[0].completed
            self.progress.update(self.task, total=done)

    def _rounds(self, done: int) -> str:
        return f"{done}/{self.num_rounds}"
