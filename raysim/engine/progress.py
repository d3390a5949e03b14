"""The console progress bar: current round, latest accuracy, ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from raysim.types import Metrics

_SHOWN = ("eval/central/accuracy", "eval/clients/accuracy", "train/accuracy")


class RoundProgress:
    """``with RoundProgress(name, num_rounds) as p: p.update(round_num, metrics)``."""

    def __init__(self, name: str, num_rounds: int, start_round: int = 0, enabled: bool = True) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not enabled,
            transient=False,
        )
        self.task = self.progress.add_task(name, total=num_rounds, completed=start_round, status="")
        self.last: dict[str, float] = {}

    def __enter__(self) -> RoundProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, round_num: int, metrics: Metrics) -> None:
        self.last.update({k: v for k, v in metrics.items() if k in _SHOWN})
        shown = next((f"{k.split('/')[-2]} acc {self.last[k]:.3f}" for k in _SHOWN if k in self.last), "")
        self.progress.update(self.task, completed=round_num + 1, status=shown)
