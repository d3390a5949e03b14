"""What ``Services.evaluate_weights`` evaluates: a predictor made of parameter points, one (a
model) or several (an ensemble predicting by the mean of their raw logits, as FuseFL's Ensemble
baseline does), each loaded into its model section; and its evaluation rows, on the central test
set or on clients, spread over the workers.

Usage:
    predictor = Predictor.of([weights])                   # the job's model
    [central] = predictor.rows(backend, None)             # None: no central test set
    rows = predictor.rows(backend, clients, "validation")  # a row (or None) per client
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raysim.runtime.backend import Backend
from raysim.services import EVALUATE, LABELS, LOGITS, MapRequest
from raysim.types import Metrics, NumpyParams

Section = dict[str, Any]  # a model section: {"name": ..., **options}


@dataclass(frozen=True)
class Predictor:
    """Parameter points predicting together, each in its model section (None: the job's model)."""

    points: tuple[NumpyParams, ...]
    sections: tuple[Section | None, ...]

    @classmethod
    def of(cls, points: Sequence[NumpyParams], sections: Sequence[Section | None] | None = None) -> Predictor:
        """``points`` in ``sections`` (one per point); in the job's model where none are given.

        Raises:
            ValueError: no point, or not one section per point.
        """
        if not points or (sections is not None and len(sections) != len(points)):
            raise ValueError("evaluate_weights: pass at least one point, and one model section per point")
        return cls(tuple(points), tuple(sections) if sections is not None else (None,) * len(points))

    @property
    def section(self) -> Section | None:
        """The one model section of every point; None: the job's model, or points of several."""
        return self.sections[0] if len(set(map(repr, self.sections))) == 1 else None

    def rows(
        self, backend: Backend, clients: Sequence[int] | None, split: str = "test", store: str = ""
    ) -> list[Metrics | None]:
        """The predictor's evaluation row on each client's ``split`` (``clients`` None: the central
        test set's, one row); None where there are no examples. An ensemble's rows hold accuracy,
        cross-entropy and examples (classification)."""
        if len(self.points) == 1:
            request = MapRequest(EVALUATE, self.points, clients, split, model=self.section, store=store)
            [rows] = backend.map_clients(request)
            return rows
        logits: list[list[np.ndarray | None]] = []
        for section in {repr(s): s for s in self.sections}.values():  # one request per architecture
            same = [p for p, s in zip(self.points, self.sections) if s == section]
            logits += backend.map_clients(
                MapRequest(LOGITS, same, clients, split, model=section, store=store)
            )
        [labels] = backend.map_clients(MapRequest(LABELS, self.points[:1], clients, split, store=store))
        return [
            None if y is None or not len(y) else mean_logit_row([member[c] for member in logits], y)
            for c, y in enumerate(labels)
        ]


def mean_logit_row(logits: Sequence[np.ndarray | None], y: np.ndarray) -> Metrics:
    """Accuracy, cross-entropy and examples of the members' mean raw logits on labels ``y``."""
    mean = torch.stack([torch.as_tensor(member) for member in logits]).float().mean(dim=0)
    target = torch.as_tensor(y).long()
    return {
        "accuracy": float((mean.argmax(dim=1) == target).float().mean()),
        "loss": float(torch.nn.functional.cross_entropy(mean, target)),
        "num_examples": float(len(target)),
    }
