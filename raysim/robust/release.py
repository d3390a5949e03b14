"""The driver's side of a robust round: the gathered updates stacked, ALIE's rows written, the
job's rule applied, and the aggregate handed to the plugin as ``WeightedMean`` would have.

The rule runs on ``raysim.robust.placement``'s device (the workers' GPU where the driver sees it)
in its memory budget; the aggregate comes back to the CPU, where the plugin's server step runs.

Usage:
    robust = RunRobust.of(job, train_pool)            # None: the job sets neither robust nor attack
    output = robust.release(output, cohort, round_num) # output.aggregate: the rule's tree
    metrics |= robust.metrics()                        # robust/*, attack/* of the latest release
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from raysim.config.job import JobConfig
from raysim.config.robust import (
    ALIE,
    CenteredClip,
    GeometricMedian,
    Krum,
    Median,
    MultiKrum,
    NormBound,
    RobustConfig,
    TrimmedMean,
    gathers_updates,
)
from raysim.errors import CheckpointError, ConfigError
from raysim.gathered_updates import Gathered, unflatten
from raysim.robust import placement, rules
from raysim.robust.attacks import alie_vector, alie_z, malicious_clients
from raysim.types import Metrics, RoundOutput

log = logging.getLogger("raysim")


def robust_vector(
    rule: RobustConfig | None,
    x: torch.Tensor,
    weights: torch.Tensor,
    start: torch.Tensor,
    chunk: int,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """``rule`` over the rows of ``x`` (n, d); None: their weighted mean (FedAvg's, for ALIE).

    ``scales`` (n,): each row's staleness weight (FedBuff, ``raysim.engine.async_robust``). Krum
    and Multi-Krum choose among the rows as sent and average the chosen rows scaled; every other
    rule reads the scaled rows (``x`` is scaled in place: it is the release's own copy)."""
    if isinstance(rule, Krum):
        return rules.krum_mean(x, rule.f, 1, chunk, scales)
    if isinstance(rule, MultiKrum):
        m = rule.m if rule.m is not None else len(x) - rule.f
        return rules.krum_mean(x, rule.f, m, chunk, scales)
    if scales is not None:
        x.mul_(scales.to(x.device, torch.float32)[:, None])
    if isinstance(rule, Median):
        return rules.median(x, chunk)
    if isinstance(rule, TrimmedMean):
        return rules.trimmed_mean(x, rule.beta, chunk)
    if isinstance(rule, GeometricMedian):
        return rules.geometric_median(x, weights, rule.nu, rule.max_iterations, rule.tol, chunk)
    if isinstance(rule, NormBound):
        return rules.norm_bounded_mean(x, weights, rule.max_norm, chunk)
    if isinstance(rule, CenteredClip):
        return rules.centered_clip(x, start, rule.tau, rule.iterations, chunk)
    w = weights.to(torch.float64)
    return rules.weighted_rows(x, w / w.sum(), chunk).to(torch.float32), {}


def check_resumable(rule: RobustConfig | None, start_round: int) -> None:
    """Refuses to resume centered clipping that starts from the previous aggregate: checkpoints do
    not keep it, and starting the resumed round from zero would silently change the run."""
    if isinstance(rule, CenteredClip) and rule.start == "previous" and start_round > 0:
        raise CheckpointError(
            f"robust: centered clipping with start: previous goes on from the last round's aggregate, "
            f"which checkpoints do not keep, so resuming at round {start_round} would change the run; "
            f"rerun from round 0, or use start: zero (stateless) for runs you mean to resume"
        )


@dataclass
class RunRobust:
    """A run's robust rule and attack on the driver, and what its latest round measured."""

    rule: RobustConfig | None
    alie: ALIE | None
    malicious: frozenset[int]  # every attack's malicious clients (its metric counts them)
    attacked: bool  # the job sets an attack (0 malicious clients in a cohort is a measurement)
    previous: torch.Tensor | None = None  # centered clipping's start: the last aggregate
    latest: Metrics = field(default_factory=dict)
    device: torch.device = torch.device("cpu")  # where the rule runs (placement.release_device)
    noted: set[str] = field(default_factory=set)  # console lines already logged: each once a run

    @classmethod
    def of(cls, job: JobConfig, train_pool: np.ndarray) -> RunRobust | None:
        """The job's, or None where it sets neither ``robust`` nor ``attack``."""
        attack = job.attack
        if job.robust is None and attack is None:
            return None
        malicious = frozenset[int]()
        if attack is not None:
            malicious = frozenset(int(c) for c in malicious_clients(train_pool, attack.fraction, job.seed))
        alie = attack if isinstance(attack, ALIE) else None
        device, note = placement.release_device(job)
        robust = cls(job.robust, alie, malicious, attack is not None, device=device)
        robust.note(note)
        return robust

    @property
    def gathers(self) -> bool:
        """Whether rounds keep every update (``RoundOptions.gathers``)."""
        return gathers_updates(self.rule, self.alie)

    def release(
        self,
        output: RoundOutput[Any],
        cohort: np.ndarray,
        round_num: int,
        scales: list[float] | None = None,
    ) -> RoundOutput[Any]:
        """``output`` with the rule's aggregate in place of the gathered updates; ``scales``: each
        gathered row's staleness weight (FedBuff's buffer), applied as ``robust_vector`` says, to
        ALIE's rows too (written from the honest rows as sent)."""
        ids = [int(c) for c in cohort]
        count = sum(c in self.malicious for c in ids)
        self.latest = {"attack/malicious_in_cohort": float(count)} if self.attacked else {}
        gathered = output.aggregate
        if not isinstance(gathered, Gathered):
            return output
        if not gathered.vectors:
            return replace(output, aggregate=None)
        device, chunk, note = placement.placed(
            len(gathered.vectors), gathered.vectors[0].numel(), self.device, self.rule
        )
        self.note(note)
        x = placement.stacked(gathered.vectors, device)
        output = replace(output, aggregate=None)  # the rows live on in x alone
        bad = [row for row, position in enumerate(gathered.positions) if ids[position] in self.malicious]
        if self.alie is not None and bad and len(bad) < len(x):
            z = self.alie.z if self.alie.z is not None else alie_z(len(x), len(bad))
            good = [row for row in range(len(x)) if row not in set(bad)]
            for cols in rules.column_slices(x.shape[1], chunk):
                x[bad, cols] = alie_vector(x[good, cols], z)
            self.latest["attack/alie_z"] = z
        start = self.previous if self.previous is not None else torch.zeros(x.shape[1])
        weights = torch.tensor(gathered.weights, dtype=torch.float64)
        factors = None if scales is None else torch.tensor(scales, dtype=torch.float64)
        try:
            vector, measured = robust_vector(self.rule, x, weights, start, chunk, factors)
        except ValueError as exc:  # a round with fewer updates than the rule needs
            raise ConfigError([f"robust: round {round_num} has {len(x)} updates: {exc}"]) from exc
        finally:
            del x
            if device.type == "cuda":  # the driver's cache would keep the rows from the workers
                torch.cuda.empty_cache()
        vector = vector.cpu()  # the plugin's server step, and next round's start, on the CPU
        if isinstance(self.rule, CenteredClip) and self.rule.start == "previous":
            self.previous = vector
        self.latest |= measured
        return replace(output, aggregate=unflatten(vector, gathered.template))

    def note(self, line: str) -> None:
        """``line`` logged, once a run (an empty one not at all)."""
        if line and line not in self.noted:
            self.noted.add(line)
            log.warning(line)

    def metrics(self) -> Metrics:
        """What the latest release measured (``robust/*``, ``attack/*``)."""
        return dict(self.latest)
