"""FedBuff under a robust rule (``robust:``) or ALIE: the rule over a server step's whole buffer.

A step's arrivals train in groups by start version (``raysim.engine.async_rounds``), and a rule
applied per group would see a part of the buffer. So the run's ``RunRobust`` is held back while
the groups train, each keeping every update (``RoundOptions.gathers``), and is applied once to
the buffer's ``buffer_size`` updates together.

Staleness weights enter before the rule: FedBuff's buffer holds each update scaled by s(tau)
(Nguyen et al., AISTATS 2022, Algorithm 1), and the rule reads that buffer, as buffered
Byzantine-robust asynchronous SGD does (BASGD, Yang and Li, AAAI 2021): a stale attacker's
update is shrunk before the rule compares it, and the rule's output needs no weight of its own.
The rows keep the clients' weights (the geometric median's and norm bounding's), so the rule
"weighted mean" is FedBuff's own ``sum_i w_i s_i delta_i / sum_i w_i``. ALIE's attacker writes
its rows from the buffer's honest rows, as it does from a synchronous cohort's.
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
    scaled by its group's staleness weight; without a rule to gather for, only the attack's
    metrics are measured (its aggregate None)."""
    cohort = np.array([c for _, ids, _ in groups for c in ids], dtype=np.int64)
    outputs = [output for _, _, output in groups]
    buffer = RoundOutput(
        stacked(groups) if robust.gathers else None,
        clients=[c for o in outputs for c in o.clients],
        failures=[f for o in outputs for f in o.failures],
        bytes_up=sum(o.bytes_up for o in outputs),
        params_up=sum(o.params_up for o in outputs),
    )
    return robust.release(buffer, cohort, step)


def stacked(groups: list[Group]) -> Gathered:
    """The groups' gathered updates as one buffer: rows scaled by s(tau), positions in the buffer."""
    positions: list[int] = []
    weights: list[float] = []
    vectors = []
    template, offset = None, 0
    for scale, ids, output in groups:
        rows = output.aggregate
        assert isinstance(rows, Gathered), "the groups train with gathers set"
        positions += [offset + p for p in rows.positions]
        weights += rows.weights
        vectors += [v * scale for v in rows.vectors]
        template = template if template is not None else rows.template
        offset += len(ids)
    return Gathered(positions, weights, vectors, template)
