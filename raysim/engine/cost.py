"""What a run costs, measured by the engine for every plugin and logged with the metrics of the
step whose work it was (docs/tracking.md, "What a round costs").

Training, from each cohort trained since the last log (a round, or a protocol's stage):
``sys/client_seconds`` (mean seconds of one client update), ``sys/client_peak_bytes`` (the most
memory one client update added on its worker), ``sys/params_up`` and ``sys/params_down`` (the
values the updates and the payload carry), ``sys/bytes_up`` and ``sys/bytes_down`` (what they
weigh: the round loop's own figures, and a protocol's where the plugin logs none) and
``sys/macs_per_example`` (one forward pass of the job's model).

Inference, with a step's evaluation metrics: ``sys/inference_macs_per_example`` and
``sys/inference_params`` of the predictor evaluated since the last log. That is the global model
(``evaluate``), the model of a ``map_clients`` EVALUATE request (FuseFL's fused model), or the
P models of a LOGITS request over P points taken together (the Ensemble's members, whose mean
logits predict).

A model's MACs are counted once per architecture (``raysim.measure.macs``) on a CPU copy built
from its section and one stored example, and then kept.

Usage:
    meter = CostMeter(info.model, store.first_rows(1).arrays["x"], store.spec)
    meter.trained(output, payload)                  # after each cohort
    meter.evaluated([section] * members)            # after each evaluation: one section a member
    metrics = meter.take(metrics) | metrics         # when the step is logged
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from raysim import params as P
from raysim.engine.metrics import bytes_down
from raysim.measure.macs import ModelCost, model_cost
from raysim.types import DataSpec, Metrics, Payload, RoundOutput

Section = dict[str, Any]  # a model section: {"name": ..., **options}


def params_down(payload: Payload, cohort_size: int) -> int:
    """The values the payload carries to the cohort: its params and extra to every client, each
    client's own part to it alone (as ``raysim.engine.metrics.bytes_down`` weighs them)."""
    shared = P.num_values(payload.params) + P.num_values(payload.extra)
    return shared * cohort_size + sum(P.num_values(part) for part in payload.per_client.values())


@dataclass
class TrainingCost:
    """The cohorts trained since the last log, added up."""

    client_seconds: list[float] = field(default_factory=list)
    peak_bytes: float | None = None
    params_up: int = 0
    params_down: int = 0
    bytes_up: int = 0
    bytes_down: float = 0.0

    def add(self, output: RoundOutput[object], payload: Payload) -> None:
        cohort_size = output.cohort_size  # every client the payload went to, the failed included
        self.client_seconds += [client.seconds for client in output.clients]
        if output.client_peak_bytes is not None:
            self.peak_bytes = max(self.peak_bytes or 0.0, output.client_peak_bytes)
        self.params_up += output.params_up
        self.params_down += params_down(payload, cohort_size)
        self.bytes_up += output.bytes_up
        self.bytes_down += bytes_down(payload, cohort_size)["sys/bytes_down"]

    def metrics(self, trained_model: ModelCost) -> Metrics:
        out = {
            "sys/params_up": float(self.params_up),
            "sys/params_down": float(self.params_down),
            "sys/bytes_up": float(self.bytes_up),  # as the round loop logs them, for a protocol's steps too
            "sys/bytes_down": self.bytes_down,
            "sys/macs_per_example": trained_model.macs_per_example,
        }
        if self.client_seconds:
            out["sys/client_seconds"] = float(np.mean(self.client_seconds))
        if self.peak_bytes is not None:
            out["sys/client_peak_bytes"] = self.peak_bytes
        return out


class CostMeter:
    """A run's cost accounting on the driver (``Engine`` holds one)."""

    def __init__(self, model: Section, example_x: np.ndarray, spec: DataSpec) -> None:
        self.model = model  # the job's model section: what the clients train
        self.example = torch.from_numpy(np.require(example_x[:1], requirements="W"))
        self.spec = spec
        self._models: dict[str, ModelCost] = {}
        self._training: TrainingCost | None = None
        self._evaluated: list[Section] | None = None  # one section per member of the predictor

    def model_cost(self, section: Section | None = None) -> ModelCost:
        """MACs per example and parameters of the model ``section`` describes (the job's model by
        default), counted the first time and then kept."""
        section = self.model if section is None else section
        key = repr(sorted(section.items()))
        if key not in self._models:
            from raysim.models import build_model

            with torch.random.fork_rng(devices=[]):  # building seeds torch: the run's stream stays
                model = build_model(str(section["name"]), section, self.spec)
            self._models[key] = model_cost(model, self.example)
        return self._models[key]

    def trained(self, output: RoundOutput[object], payload: Payload) -> None:
        self._training = self._training or TrainingCost()
        self._training.add(output, payload)

    def evaluated(self, members: Sequence[Section | None] = (None,)) -> None:
        """The predictor just evaluated: one model section per member (None: the job's model), so an
        ensemble of several architectures costs the sum of its members."""
        self._evaluated = [self.model if section is None else section for section in members]

    def take(self, metrics: Metrics) -> Metrics:
        """The cost of what was done since the last log, to log with ``metrics``: training's when a
        cohort trained, inference's when ``metrics`` hold an evaluation; then starts afresh."""
        out: Metrics = {}
        if self._training is not None:
            out |= self._training.metrics(self.model_cost())
        if self._evaluated is not None and any(key.startswith("eval/") for key in metrics):
            costs = [self.model_cost(section) for section in self._evaluated]
            out |= {
                "sys/inference_macs_per_example": sum(cost.macs_per_example for cost in costs),
                "sys/inference_params": float(sum(cost.params for cost in costs)),
            }
        self._training, self._evaluated = None, None
        return out
