"""Asynchronous FL's server steps (``engine.asynchrony``: FedBuff, FedAsync) on the simulated clock.

Each logged step is one server step. ``raysim.systems.async_clock.AsyncClock`` says which clients
arrive, from which model version; the arrivals are trained here, at the step that folds them,
grouped by the version each started from. That is the same simulation as training each client
when it starts: its update depends only on its start model (its version, ``round_num`` to the
workers) and its draws (data, seed: keyed by its launch, ``RoundOptions.state_keys``, so two
launches from one version train apart), never on what the server did meanwhile. Only the model
versions some client in flight started from are kept (``raysim.engine.async_state``, which a
checkpoint saves so that a resumed run goes on as if never stopped).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from raysim.algorithm import Algorithm, runs_rounds
from raysim.config.asynchrony import AsynchronyConfig
from raysim.engine.async_robust import release_buffer, rule_held
from raysim.engine.engine import Engine, refuse_nonfinite
from raysim.engine.progress import RoundProgress
from raysim.services import RoundOptions
from raysim.systems.async_clock import AsyncClock, Flight, staleness_weight
from raysim.types import Metrics, Params, RoundOutput, ServerState

Delta = Params | None  # a FedAvg-family plugin's aggregate: the mean delta, None when nobody reported
STALENESS_FILE = "staleness.json"  # the run's histogram of staleness, an artifact


def async_loop(engine: Engine[Delta], state: ServerState, bar: RoundProgress | None = None) -> ServerState:
    """Server steps of FedBuff or FedAsync up to ``num_rounds`` (from ``start_round`` where the run
    resumes); the final server state. ``engine.asynchrony`` holds what a checkpoint keeps of them."""
    run = engine.asynchrony
    assert run is not None  # build opens it for every job with engine.asynchrony
    config, clock = run.config, run.clock
    count, first = config.updates_per_step, engine.start_round
    for step, arrived, failed in server_steps(clock, count, first, engine.num_rounds, run.last_end_s):
        engine.on_phase("training")
        needed = {flight.version for flight in arrived + clock.in_flight}
        versions = {v: s for v, s in run.versions.items() if v in needed}
        state, metrics = server_step(engine, config, state, versions, arrived, step)
        run.versions = versions | {step + 1: state}
        run.last_end_s = arrived[-1].end_s
        staleness = [step - flight.version for flight in arrived]
        run.histogram.update(staleness)
        engine.cohorts[step] = [flight.client for flight in arrived]
        metrics |= {
            "sys/sim_clock_s": arrived[-1].end_s,
            "sys/aggregated_clients": float(len(arrived)),
            "async/staleness_mean": float(np.mean(staleness)),
            "async/staleness_max": float(max(staleness)),
            "async/failed": float(failed),
            "async/versions_kept": float(len(run.versions)),
        }
        metrics = engine.end_round(state, step, metrics)  # a checkpoint keeps ``run`` as it is now
        if bar is not None:
            bar.update(step, metrics)
    save_histogram(engine, run.histogram)
    return state


def server_steps(
    clock: AsyncClock, count: int, first: int, steps: int, now: float = 0.0
) -> Iterator[tuple[int, list[Flight], int]]:
    """Each server step's arrivals (``count`` reports, in order) and failures among them, from step
    ``first`` (``now``: when the step before it ended). A slot that frees while the buffer fills
    starts a client on the model of the moment; the last one's waits for the step, whose new model
    it then trains, launched as the next step begins: a checkpoint taken at a step (``final.pt``
    too) sees that slot still free, and a finished run launches no client it would not train (an
    availability trace that ends there fails only a resume that runs on)."""
    for step in range(first, steps):
        clock.fill(step, now)
        arrived, failed = arrivals(clock, count, step)
        yield step, arrived, failed
        now = arrived[-1].end_s


def arrivals(clock: AsyncClock, count: int, version: int) -> tuple[list[Flight], int]:
    """The next ``count`` reports, in order, and the failures among them; every slot but the last
    one's is refilled on ``version`` at once (the last waits for the server step)."""
    arrived: list[Flight] = []
    failed = 0
    while len(arrived) < count:
        flight = clock.pop()
        if flight.reported:
            arrived.append(flight)
        else:
            failed += 1
        if len(arrived) < count:
            clock.fill(version, flight.end_s)
    return arrived, failed


def server_step(
    engine: Engine[Delta],
    config: AsynchronyConfig,
    state: ServerState,
    versions: dict[int, ServerState],
    arrived: list[Flight],
    step: int,
) -> tuple[ServerState, Metrics]:
    """Trains the arrivals from their start versions and folds them into the model; a robust
    rule (or ALIE) sees the whole buffer (``raysim.engine.async_robust``)."""
    with rule_held(engine) as robust:
        gathers = robust is not None and robust.gathers
        trained = [
            (step - b[0].version, b, train(engine, versions[b[0].version], b, gathers))
            for b in batches(arrived)
        ]
    buffer = merged([output for _, _, output in trained])
    if robust is not None:
        scaled = [
            (staleness_weight(config.staleness, tau), [f.client for f in b], o) for tau, b, o in trained
        ]
        buffer = release_buffer(robust, scaled, step)
    algorithm = delta_plugin(engine)
    payload = algorithm.payload(state, step, engine.info)  # what every client received, in size
    metrics = engine.round_metrics(buffer, payload)
    if config.kind == "fedasync":
        [(tau, _, output)] = trained
        alpha = config.alpha * staleness_weight(config.staleness, tau)
        start = versions[arrived[0].version].params
        new_state = replace(state, params=mix(state.params, start, output.aggregate, alpha))
        metrics |= {"async/mixing": alpha}
    elif robust is not None and robust.gathers:  # the rule's aggregate of the weighted buffer
        new_state, server_metrics = algorithm.server_update(state, buffer.aggregate, step, engine.info)
        metrics |= server_metrics
    else:
        weighted = [
            (staleness_weight(config.staleness, tau), group_weight(engine, o), o.aggregate)
            for tau, _, o in trained
        ]
        new_state, server_metrics = algorithm.server_update(state, buffered_mean(weighted), step, engine.info)
        metrics |= server_metrics
    refuse_nonfinite(new_state.params, "the new global model", step)
    return new_state, metrics


def batches(arrived: list[Flight]) -> list[list[Flight]]:
    """The arrivals grouped by start version, in order of first arrival, trained in that order; a
    client that arrives twice trains in a group after the one holding its earlier arrival (a
    cohort holds a client once, and its stored state, the upload's error feedback, goes from each
    of its launches to the next)."""
    groups: list[list[Flight]] = []
    for flight in arrived:
        after = max(
            (i for i, g in enumerate(groups) if any(f.client == flight.client for f in g)), default=-1
        )
        home = next((g for g in groups[after + 1 :] if g[0].version == flight.version), None)
        if home is None:
            groups.append([flight])
        else:
            home.append(flight)
    return groups


def train(
    engine: Engine[Delta], start: ServerState, batch: list[Flight], gathers: bool = False
) -> RoundOutput[Delta]:
    """One group's training from the model version it started from (its ``round_num``); with
    ``gathers`` every update kept, for a robust rule over the buffer."""
    version = batch[0].version
    payload = delta_plugin(engine).payload(start, version, engine.info)
    budgets = {flight.client: flight.budget for flight in batch if flight.budget is not None}
    launches = {flight.client: flight.launch for flight in batch}  # its draws, state read and kept
    cohort = np.array([flight.client for flight in batch], dtype=np.int64)
    options = RoundOptions(step_budgets=budgets, gathers=gathers, state_keys=launches)
    return engine.train_cohort(payload, cohort, version, options)


def delta_plugin(engine: Engine[Delta]) -> Algorithm[Delta]:
    """The run's plugin, of the round loop's shape (``check_asynchrony`` refused any other)."""
    algorithm = engine.algorithm
    if not runs_rounds(algorithm):
        raise TypeError(f"algorithm {engine.job.algorithm.name!r} has no round loop for asynchronous steps")
    return algorithm


def group_weight(engine: Engine[Delta], output: RoundOutput[Delta]) -> float:
    """What the plugin's ``WeightedMean`` divided the group's sum by: its clients' weights, or
    their count where it is unweighted."""
    weighted = getattr(delta_plugin(engine).aggregator(), "weighted", True)
    return float(sum(c.weight for c in output.clients)) if weighted else float(len(output.clients))


def buffered_mean(groups: list[tuple[float, float, Params | None]]) -> Params | None:
    """FedBuff's buffer: ``sum_g s_g W_g mean_g / sum_g W_g`` over the groups' (staleness weight
    s_g, total client weight W_g, mean delta); the plain weighted mean when every s_g is 1."""
    present = [(s, w, mean) for s, w, mean in groups if mean is not None and w > 0]
    if not present:
        return None
    total = sum(w for _, w, _ in present)
    sums: Params = {}
    for s, w, mean in present:
        for key, tensor in mean.items():
            scaled = tensor.double() * (s * w / total)
            sums[key] = sums[key] + scaled if key in sums else scaled
    return {key: tensor.float() for key, tensor in sums.items()}


def mix(current: Params, start: Params, delta: Params | None, alpha: float) -> Params:
    """FedAsync: ``(1 - alpha) x + alpha x_client``, the client's model ``x_client = start - delta``."""
    if delta is None:
        return current
    return {k: (1 - alpha) * current[k] + alpha * (start[k] - delta[k].to(start[k].dtype)) for k in current}


def merged(outputs: list[RoundOutput[Any]]) -> RoundOutput[None]:
    """The groups' outputs as one cohort's, for its metrics."""
    return RoundOutput(
        None,
        clients=[c for o in outputs for c in o.clients],
        failures=[f for o in outputs for f in o.failures],
        bytes_up=sum(o.bytes_up for o in outputs),
        params_up=sum(o.params_up for o in outputs),
    )


def save_histogram(engine: Engine[Any], histogram: Counter[int]) -> None:
    """How many updates arrived at each staleness, as ``staleness.json`` in the run's folder."""
    engine.run_dir.mkdir(parents=True, exist_ok=True)
    path = engine.run_dir / STALENESS_FILE
    path.write_text(json.dumps({str(tau): n for tau, n in sorted(histogram.items())}))
    engine.tracker.log_artifact(path)
