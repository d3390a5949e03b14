"""The round itself: sample, broadcast, train and fold on the workers, update the server, probe.

``Engine.run_round`` (engine/engine.py) is ``play_round``; a staged plugin reaches it through the
engine's verbs (``raysim.services.Services``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from raysim import params as P
from raysim.algorithm import pseudo_gradient, pure_aggregate
from raysim.engine.metrics import round_metrics
from raysim.errors import NonFiniteError
from raysim.probe import Probe, ProbeRound
from raysim.services import RoundOptions
from raysim.types import Metrics, Payload, RoundOutput, ServerState

if TYPE_CHECKING:
    from raysim.engine.engine import Engine

A = TypeVar("A")  # the algorithm's aggregate type


def play_round(engine: Engine[A], state: ServerState, round_num: int) -> tuple[ServerState, Metrics]:
    """One round: sample, broadcast, train and fold on workers, update the server, probe."""
    t0 = time.perf_counter()
    engine.on_phase("training")
    # 1. Sample the cohort: a pure function of (seed, round_num), or the fixed schedule.
    cohort = engine.cohort(round_num)
    # 2. One payload for every client; each worker folds its clients into one partial.
    payload = engine.algorithm.broadcast(state, round_num)
    probes = engine.due_probes(round_num)
    plan = engine.system.round(round_num) if engine.system is not None else None
    budgets = plan.step_budgets if plan is not None else {}
    options = RoundOptions(tuple(probes), any(p.keeps_local_models for p in probes.values()), budgets)
    if plan is not None and not len(cohort):  # nobody reported in time: the model stays
        return state, plan.metrics() | {"sys/round_s": time.perf_counter() - t0}
    output = engine.train_cohort(payload, cohort, round_num, options)
    # 3. Merge happened in the backend; the server updates from the aggregate.
    new_state, metrics = engine.algorithm.server_update(state, output.aggregate, round_num)
    refuse_nonfinite(new_state.params, "the new global model", round_num)
    metrics |= round_metrics(output, payload, len(cohort), time.perf_counter() - t0)
    if plan is not None:
        metrics |= plan.metrics()
    # 4. Probes due this round summarize what their worker hooks measured.
    if probes:
        metrics |= probe_round(engine, probes, state, new_state, payload, output, round_num)
    return new_state, metrics


def probe_round(
    engine: Engine[A],
    probes: dict[str, Probe],
    old: ServerState,
    new: ServerState,
    payload: Payload,
    output: RoundOutput[A],
    round_num: int,
) -> Metrics:
    """Each due probe's summary of the round (its rows, the models before and after)."""
    grad = pseudo_gradient(engine.algorithm, output.aggregate, old.params)
    view = ProbeRound(
        round_num=round_num,
        rows=[],
        broadcast=payload.params,
        global_params=P.to_numpy(new.params),
        pure_aggregate=P.to_numpy(pure_aggregate(old.params, grad)) if grad is not None else None,
        local_models=output.local_models,
    )
    metrics: Metrics = {}
    for name, probe in probes.items():
        metrics |= probe.summarize(replace(view, rows=output.probe_rows.get(name, [])), engine)
    return metrics


def refuse_nonfinite(tree: object, what: str, round_num: int) -> None:
    """Stops the run when ``tree`` holds NaN or infinity: it would poison every later round."""
    if not P.is_finite(tree):
        bad = P.nonfinite_names(tree)
        raise NonFiniteError(
            f"round {round_num}: {what} holds NaN or infinity in {bad[:5]}"
            f"{' ...' if len(bad) > 5 else ''}; every client's update was finite, so aggregation "
            f"or the server step made it (an overflow, a division by zero, or too large a "
            f"server learning rate)"
        )
