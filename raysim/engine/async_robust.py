"""FedBuff under a robust rule (``robust:``) or ALIE: the rule over a server step's whole buffer.

A step's arrivals train in groups by start version (``raysim.engine.async_rounds``), and a rule
applied per group would see a part of the buffer. So the run's ``RunRobust`` is held back while
the groups train, each keeping every update (``RoundOptions.gathers``), and is applied once to
the buffer's ``buffer_size`` updates together: a rule over buffered updates, BASGD's idea (Yang
and Li, "Buffered Asynchronous SGD for Byzantine Learning", ICML 2021), whose rule reads its
buffers' averages with no staleness weight.

The staleness weights are raysim's choice, not BASGD's. Each row is a client's update as sent,
with its s(tau) (FedBuff's, Nguyen et al., AISTATS 2022, Algorithm 1), and ``RunRobust.release``:
- Krum and Multi-Krum choose among the rows as sent, then average the chosen rows scaled by
  s(tau). Their choice compares distances, and a row shrunk by s(tau) lies near every other (noisy
  honest updates centre near zero), so scaled rows would make Krum choose the stalest updates;
- the median, trimmed mean, geometric median, norm bounding and centered clipping read the scaled
  rows, as FedBuff's buffer holds them. A stale row shrinks toward zero, and so does the rule's
  output: a smaller step, as in FedBuff's own mean, not a rule preferring stale updates. Their
  output needs no weight of its own, and the rule "weighted mean" is FedBuff's
  ``sum_i w_i s_i delta_i / sum_i w_i`` (the rows keep the clients' weights).
ALIE's attacker writes its rows from the buffer's honest rows as sent (what Baruch et al.'s
attacker sees), and its rows are then scaled by their own s(tau), as every update of a stale
client is, the attacks applied on the workers (sign flip, scale, Gaussian) included.

Memory: the buffer's rows are the groups' gathered vectors themselves, not copies, so the driver
holds them and the release's stacked ``n x d`` (two copies, as a synchronous round does).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from raysim.engine.engine import Engine
from raysim.gathered_updates import Gathered
from raysim.robust.release import RunRobust
from raysim.types import RoundOutput

Group = tuple[float, list[int], RoundOutput[Any]]  # (staleness weight, cohort ids, trained output)


@contextmanager
def rule_held(engine: Engine[Any]) -> Iterator[RunRobust | None]:
    """The run's ``RunRobust`` (None: the job has none), kept from ``Engine.train_cohort`` while a
    step's groups train, so that it applies to the whole buffer instead of each group."""
    robust = engine.robust
    engine.robust = None
    try:
        yield robust
    finally:
        engine.robust = robust


def release_buffer(robust: RunRobust, groups: list[Group], step: int) -> RoundOutput[Any]:
    """The buffer's groups as one output whose aggregate is the rule's over every update, each
    weighted by its group's staleness weight (``RunRobust.release``); without a rule to gather
    for, only the attack's metrics are measured (its aggregate None)."""
    cohort = np.array([c for _, ids, _ in groups for c in ids], dtype=np.int64)
    outputs = [output for _, _, output in groups]
    rows, scales = stacked(groups) if robust.gathers else (None, None)
    buffer = RoundOutput(
        rows,
        clients=[c for o in outputs for c in o.clients],
        failures=[f for o in outputs for f in o.failures],
        bytes_up=sum(o.bytes_up for o in outputs),
        params_up=sum(o.params_up for o in outputs),
    )
    return robust.release(buffer, cohort, step, scales)


def stacked(groups: list[Group]) -> tuple[Gathered, list[float]]:
    """The groups' gathered updates as one buffer (positions in the buffer, the rows as sent: no
    copy), and each row's staleness weight."""
    positions: list[int] = []
    weights: list[float] = []
    scales: list[float] = []
    vectors = []
    template, offset = None, 0
    for scale, ids, output in groups:
        rows = output.aggregate
        assert isinstance(rows, Gathered), "the groups train with gathers set"
        positions += [offset + p for p in rows.positions]
        weights += rows.weights
        scales += [scale] * len(rows.vectors)
        vectors += rows.vectors
        template = template if template is not None else rows.template
        offset += len(ids)
    return Gathered(positions, weights, vectors, template), scales
