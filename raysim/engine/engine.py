"""A run's pieces, the round itself, and the verbs the round loop, staged plugins and probes use.

``Engine`` holds what ``build`` made (algorithm, store, backend, tracker, evaluation plan,
probes) and is a ``raysim.services.Services``: a staged plugin, a probe's ``summarize``, the
analysis of a finished run and the landscape scans receive the engine itself, typed against that
protocol, which names the verbs they may use.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from raysim import params as P
from raysim.algorithm import AnyAlgorithm, runs_rounds
from raysim.compress.downlink import Downlink
from raysim.config import JobConfig
from raysim.config.plugins import section_config
from raysim.data.store import ClientStore
from raysim.engine.async_state import AsyncRun
from raysim.engine.checkpoint_writer import write_checkpoint
from raysim.engine.cost import CostMeter
from raysim.engine.evaluation import EvaluationPlan, TimeToTarget, evaluate_global, evaluate_predictor
from raysim.engine.metrics import round_metrics, round_timing
from raysim.engine.predictor import Predictor
from raysim.engine.round_timer import Phase, RoundTimer
from raysim.errors import ClientError, ConfigError, NonFiniteError, RaysimError
from raysim.plugin_defaults import aggregator_of, pseudo_gradient, with_client_payloads
from raysim.privacy.run_privacy import RunPrivacy
from raysim.probe import Probe, ProbeRound, is_due
from raysim.robust.release import RunRobust
from raysim.runtime.backend import Backend
from raysim.sampling import CohortSchedule, poisson_rate, sample_cohort, sample_cyclic_poisson, sample_poisson
from raysim.selection.selector import Selector, choose, feedback_of
from raysim.services import EVALUATE, LOGITS, MapRequest, RoundOptions
from raysim.stop_request import honour_stop_request
from raysim.systems.rounds import SimulatedSystem
from raysim.tracking.tracker import Tracker
from raysim.types import Metrics, NumpyParams, Payload, RoundOutput, RunInfo, ServerState

log = logging.getLogger("raysim")
# A training loss above this says the run diverges while its model is still finite (so nothing
# stops it): cross-entropy starts near ln(num_classes) (under 13 even for a 400k-token vocabulary)
# and a regression on standardized targets near 1, so a run that is learning stays far below it.
DIVERGING_LOSS = 1e6
A = TypeVar("A")  # the algorithm's aggregate type
R = TypeVar("R")  # one ``map_clients`` result


@dataclass(kw_only=True)
class Engine(Generic[A]):
    """Everything one run is made of, built once by ``engine.build`` (by keyword: its fields are many,
    several of one type)."""

    job: JobConfig
    algorithm: AnyAlgorithm[A]
    store: ClientStore
    backend: Backend
    tracker: Tracker
    info: RunInfo
    run_dir: Path
    state_dir: Path
    plan: EvaluationPlan
    train_pool: np.ndarray
    probes: dict[str, Probe] = field(default_factory=dict)
    schedule: CohortSchedule | None = None
    start_round: int = 0
    cohorts: dict[int, list[int]] = field(default_factory=dict)  # round -> client ids, as drawn
    history: list[tuple[int, Metrics]] = field(default_factory=list)
    system: SimulatedSystem | None = None  # the clients as devices on a simulated clock
    targets: TimeToTarget | None = None  # evaluation.time_to_target
    privacy: RunPrivacy | None = None  # central DP's ledger, and what each client spent
    selector: Selector | None = None  # engine.selection (raysim.selection); None: uniform
    robust: RunRobust | None = None  # a robust rule and an attack's malicious clients
    downlink: Downlink | None = None  # compression.download; None: the broadcast goes whole
    asynchrony: AsyncRun | None = None  # engine.asynchrony's clock and clients in flight
    on_phase: Callable[[str], None] = lambda phase: None  # the progress display's phase (progress.PHASES)
    on_log: Callable[[int, Metrics], None] = lambda step, metrics: None  # the progress display's count
    warned_diverging: bool = False  # the warning about a huge training loss comes once per run
    round_timer: RoundTimer | None = None  # the latest ``run_round``'s, until its ``end_round``
    costs: CostMeter = field(init=False)  # what is trained and evaluated, logged with its step

    def __post_init__(self) -> None:
        self.costs = CostMeter(self.info.model, self.store.first_rows(1).arrays["x"], self.store.spec)

    # --- the verbs (raysim.services.Services) ---------------------------------------------

    def cohort(self, round_num: int) -> np.ndarray:
        """This round's cohort: from the fixed schedule, else a pure function of (seed, round); with
        a ``system``, the drawn clients that report in time (pure functions of the seed too)."""
        if self.schedule is not None:
            cohort = self.schedule.cohort(round_num)
        elif self.system is not None:
            cohort = self.system.round(round_num).cohort
        else:  # held-out clients are not in the pool
            cohort = self.draw_cohort(round_num)
        self.cohorts[round_num] = [int(c) for c in cohort]  # drawing a round twice records it once
        return cohort

    def draw_cohort(self, round_num: int) -> np.ndarray:
        """The round's draw from the training pool: ``cohort_size`` clients, or each with the
        probability ``raysim.sampling.poisson_rate`` gives (``engine.sampling: poisson``; under
        DP-FTRL's bands, from the round's group of clients only)."""
        pool, size, seed = self.train_pool, self.job.engine.cohort_size, self.job.seed
        if self.selector is not None:  # engine.selection: guided, a fixed size
            return choose(self.selector, pool, size, seed, round_num)
        if self.job.engine.sampling == "fixed":
            return pool[sample_cohort(len(pool), size, seed, round_num)]
        ledger = self.privacy.ledger if self.privacy is not None else None
        if ledger is None or ledger.groups is None:
            return pool[sample_poisson(len(pool), poisson_rate(len(pool), size), seed, round_num)]
        bands = ledger.config.bands
        rate = poisson_rate(len(pool), size, bands)
        return pool[sample_cyclic_poisson(ledger.groups, bands, rate, seed, round_num)]

    def train_cohort(
        self, payload: Payload, cohort: np.ndarray, round_num: int, options: RoundOptions = RoundOptions()
    ) -> RoundOutput[A]:
        """Trains a cohort and applies the failure policy (``engine.max_failed_clients``); under
        central DP the workers clip and the ledger releases the merged sums; under a robust rule
        (or ALIE) the workers keep every update and the driver applies the rule (``raysim.robust``)."""
        if self.privacy is not None:  # central DP: the workers clip each contribution
            options = replace(options, clipping=self.privacy.clipping())
        if self.robust is not None and self.robust.gathers:  # a robust rule reads every update
            options = replace(options, gathers=True)
        output = self.backend.train_cohort(self.algorithm, payload, cohort, round_num, options)
        if len(output.failures) > self.job.engine.max_failed_clients:
            first = output.failures[0]  # the run stops on the first, its exception the cause
            raise ClientError(
                first.client_id, round_num, first.stage, first.error, first.raised_at
            ) from first.error
        for failure in output.failures:
            log.warning(
                "round %d: client %d failed and was dropped: %r", round_num, failure.client_id, failure.error
            )
        if self.privacy is not None:
            output = self.privacy.release(aggregator_of(self.algorithm), output, round_num)
        if self.robust is not None:
            output = self.robust.release(output, cohort, round_num)
        refuse_nonfinite(output.aggregate, "the aggregate of the clients' updates", round_num)
        self.costs.trained(output, payload)
        return output

    def run_round(self, state: ServerState, round_num: int) -> tuple[ServerState, Metrics]:
        """One round: sample, broadcast, train and fold on workers, update the server, probe."""
        algorithm = self.algorithm
        if not runs_rounds(algorithm):
            raise TypeError(
                f"algorithm {self.job.algorithm.name!r} runs its own protocol without the round loop's "
                f"payload and server_update: its protocol cannot call services.run_round"
            )
        t0 = time.perf_counter()
        self.round_timer = timer = RoundTimer(round_num)  # where the time goes, to ``end_round``
        self.on_phase("training")
        # 1. Sample the cohort: a pure function of (seed, round_num), or the fixed schedule.
        cohort = self.cohort(round_num)
        timer.lap("sampling")
        # 2. One payload for every client (and a part for each, where the plugin sends one);
        #    each worker folds its clients into one partial.
        shared = algorithm.payload(state, round_num, self.info)
        payload = with_client_payloads(algorithm, shared, state, round_num, cohort, self.info)
        if self.downlink is not None:  # the clients train from the model they decode, x̂
            payload = self.downlink.send(payload, round_num)
        timer.lap("broadcast")
        probes = self.due_probes(round_num)
        plan = self.system.round(round_num) if self.system is not None else None
        budgets = plan.step_budgets if plan is not None else {}
        options = RoundOptions(tuple(probes), any(p.keeps_local_models for p in probes.values()), budgets)
        if plan is not None and not len(cohort):  # nobody reported in time: the model stays
            return state, plan.metrics() | {"sys/round_s": time.perf_counter() - t0}
        timer.lap()
        output = self.train_cohort(payload, cohort, round_num, options)
        refuse_all_failed(output, round_num)
        timer.add_cohort(output, self.backend.is_concurrent)
        if self.selector is not None:  # it learns from who trained, and how long each took
            seconds = plan.durations() if plan is not None else None
            self.selector.observe(round_num, feedback_of(output.clients, seconds))
        # 3. Merge happened in the backend; the server updates from the aggregate.
        new_state, metrics = algorithm.server_update(state, output.aggregate, round_num, self.info)
        refuse_nonfinite(new_state.params, "the new global model", round_num)
        timer.lap("server_update")
        metrics |= self.round_metrics(output, payload) | round_timing(output, time.perf_counter() - t0)
        if plan is not None:
            metrics |= plan.metrics()
        # 4. Probes due this round summarize what their worker hooks measured.
        if probes:
            with self.timed("evaluation"):  # a probe measures the round, as an evaluation does
                metrics |= self.summarize_probes(probes, state, new_state, payload, output, round_num)
        return new_state, metrics

    def round_metrics(self, output: RoundOutput[object], payload: Payload) -> Metrics:
        """A trained cohort's metrics (``raysim.engine.metrics.round_metrics``)."""
        return round_metrics(output, payload)

    def evaluate(self, state: ServerState, round_num: int | None = None) -> Metrics:
        """The global model evaluated; personalization and transfer too when due."""
        personalize = round_num is not None and round_num >= 0 and self.is_personalization_round(round_num)
        personalizing = personalize and self.job.evaluation.personalization is not None
        self.on_phase("personalizing" if personalizing else "evaluating")
        self.costs.evaluated()  # the global model
        with self.timed("evaluation"):
            return evaluate_global(
                self.backend, state.params, self.plan, round_num if personalize else None, round_num
            )

    def evaluate_weights(
        self, points: Sequence[NumpyParams], sections: Sequence[dict[str, Any]] | None = None
    ) -> Metrics:
        """Any weights as the evaluation plan evaluates the global model (``evaluate_predictor``);
        their sections are checked here, before any worker sees them."""
        for section in sections or ():
            section_config("model", section, "evaluate_weights model.")
        predictor = Predictor.of(points, sections)
        self.on_phase("evaluating")
        self.costs.evaluated(predictor.sections)  # an ensemble: each member's model
        with self.timed("evaluation"):
            return evaluate_predictor(self.backend, predictor, self.plan)

    def map_clients(self, request: MapRequest[R]) -> list[list[R | None]]:
        """Each point on each client over all workers (the request was checked when made; its
        model section is checked here, before any worker sees it)."""
        if request.model is not None:
            section_config("model", request.model, "map_clients model.")
        if request.store and request.store not in self.plan.transfer:
            raise ConfigError(
                [
                    f"map_clients store {request.store!r}: not a transfer dataset of this job; name one of "
                    f"evaluation.transfer ({sorted(self.plan.transfer)}) or '' for the job's own clients"
                ]
            )
        if request.task in (EVALUATE, LOGITS):  # the logits of P points: an ensemble of P models
            self.costs.evaluated([request.model] * (len(request.points) if request.task == LOGITS else 1))
        return self.backend.map_clients(request)

    def end_round(self, state: ServerState, round_num: int, metrics: Metrics) -> Metrics:
        """A round's bookkeeping: evaluate when due, log, checkpoint when due; the logged metrics.

        After ``run_round`` it logs where the round's time went (``raysim.engine.round_timer``)."""
        if self.is_eval_round(round_num) or self.is_personalization_round(round_num):
            metrics = metrics | self.evaluate(state, round_num)
            if self.targets is not None:
                clock = metrics.get("sys/sim_clock_s") if self.system is not None else None
                metrics |= self.targets.reached(metrics, round_num, clock)
        if (timer := self.take_round_timer(round_num)) is not None:
            metrics |= timer.metrics()
        if self.privacy is not None:  # a staged plugin's rounds too
            metrics |= self.privacy.metrics()
        if self.robust is not None:
            metrics |= self.robust.metrics()
        self.log(metrics, round_num)
        self.warn_if_diverging(metrics, round_num)
        self.maybe_checkpoint(state, round_num)
        honour_stop_request()  # a SIGTERM lost where it landed ends the run here, KILLED
        return metrics

    @contextmanager
    def timed(self, phase: Phase) -> Iterator[None]:
        """Counts the block as ``phase`` of the round being timed, if any (what came before it since
        the timer's last lap counts as other)."""
        timer = self.round_timer
        if timer is not None:
            timer.lap()
        yield
        if timer is not None:
            timer.lap(phase)

    def take_round_timer(self, round_num: int) -> RoundTimer | None:
        """``run_round``'s timer of this round, handed out once (None: a protocol's own round)."""
        timer, self.round_timer = self.round_timer, None
        return timer if timer is not None and timer.round_num == round_num else None

    def warn_if_diverging(self, metrics: Metrics, round_num: int) -> None:
        """Warns once per run when the training loss passes ``DIVERGING_LOSS`` (the run goes on)."""
        loss = metrics.get("train/loss")
        if self.warned_diverging or loss is None or not abs(loss) > DIVERGING_LOSS:
            return
        self.warned_diverging = True
        log.warning(
            "round %d: train/loss is %.3g (over %.0e) while the model is still finite: the run is "
            "diverging; lower algorithm.local.lr or set algorithm.local.grad_clip",
            round_num,
            loss,
            DIVERGING_LOSS,
        )

    def log(self, metrics: Metrics, round_num: int) -> None:
        metrics = self.costs.take(metrics) | metrics  # a plugin's own figure wins
        self.history.append((round_num, metrics))
        self.tracker.log_metrics(metrics, step=round_num)
        self.on_log(round_num, metrics)  # a staged plugin's steps too

    def checkpoint(self, state: ServerState, round_num: int, name: str | None = None) -> Path:
        """Server state plus a hard-link snapshot of the client state as of ``round_num``
        (``raysim.engine.checkpoint_writer``)."""
        return write_checkpoint(self, state, round_num, name)

    def summarize_probes(
        self,
        probes: dict[str, Probe],
        old: ServerState,
        new: ServerState,
        payload: Payload,
        output: RoundOutput[A],
        round_num: int,
    ) -> Metrics:
        """Each due probe's summary of the round (its rows, the models before and after)."""
        grad = pseudo_gradient(self.algorithm, output.aggregate, old.params)
        view = ProbeRound(
            round_num=round_num,
            rows=[],
            broadcast=payload.params,
            global_params=P.to_numpy(new.params),
            pure_aggregate=P.to_numpy(P.pure_aggregate(old.params, grad)) if grad is not None else None,
            local_models=output.local_models,
        )
        metrics: Metrics = {}
        for name, probe in probes.items():
            metrics |= probe.summarize(replace(view, rows=output.probe_rows.get(name, [])), self)
        return metrics

    # --- cadence ------------------------------------------------------------------------------

    @property
    def num_rounds(self) -> int:
        """The job's rounds, or fewer where the privacy budget stops the run first
        (``privacy.budget.when_reached: stop``)."""
        allowed = self.privacy.rounds_allowed if self.privacy is not None else None
        return self.job.engine.num_rounds if allowed is None else min(allowed, self.job.engine.num_rounds)

    def is_eval_round(self, round_num: int) -> bool:
        return _every(self.job.evaluation.every, round_num) or round_num == self.num_rounds - 1

    def is_personalization_round(self, round_num: int) -> bool:
        config = self.job.evaluation.personalization
        last = round_num == self.num_rounds - 1
        return last or (config is not None and _every(config.every, round_num))

    def due_probes(self, round_num: int) -> dict[str, Probe]:
        return {name: probe for name, probe in self.probes.items() if is_due(probe, round_num)}

    def maybe_checkpoint(self, state: ServerState, round_num: int) -> None:
        if _every(self.job.engine.checkpoint_every, round_num):
            self.checkpoint(state, round_num)


def _every(every: int, round_num: int) -> bool:
    """Due after every ``every``-th round (0: never)."""
    return every > 0 and (round_num + 1) % every == 0


def refuse_all_failed(output: RoundOutput[Any], round_num: int) -> None:
    """Stops a round whose every client failed, however many ``engine.max_failed_clients`` lets it
    drop: nothing was aggregated, and a run of such rounds would end FINISHED, untrained. (An
    asynchronous step's group of one start version may fail whole: the rest of its buffer trained.)"""
    if output.failures and not output.clients:
        first = output.failures[0]
        error = ClientError(first.client_id, round_num, first.stage, first.error, first.raised_at)
        raise RaysimError(
            f"round {round_num}: all {len(output.failures)} clients of the cohort failed, so nothing "
            f"was aggregated (engine.max_failed_clients drops some of a round, never all); the first: {error}"
        ) from first.error


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
