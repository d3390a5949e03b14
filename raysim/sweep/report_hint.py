"""The ``raysim report`` command that tabulates a tracked sweep, printed at its end: the sweep's
id, a metric its cells logged, its first axis as the columns and any other axes chosen on a
validation metric (docs/reports.md), and the store when it is not the default one.

Usage:
    report_command(sweep, outcomes, uri)
    # raysim report mnist-laptop-1a2b3c4d --metric eval/central/accuracy --columns algorithm.local.lr
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from raysim.config import TrackingConfig
from raysim.config.cells import Sweep
from raysim.sweep.cell_ledger import CellOutcome
from raysim.tracking.tracking_store import tracking_uri

# the metric a table is most likely about, in order of preference, when the cells logged it
REPORTED = (
    "eval/central/accuracy",
    "eval/clients/accuracy",
    "eval/central/perplexity",
    "eval/clients/perplexity",
    "eval/central/loss",
    "eval/clients/loss",
)
VALIDATION = "VALIDATION_METRIC"  # what the user fills in: no cell says which split is validation


def report_command(sweep: Sweep, outcomes: Iterable[CellOutcome], uri: str) -> str:
    """The command line that tabulates ``sweep`` (whose cells logged the metrics in ``outcomes``)."""
    words = ["raysim", "report", sweep.id, "--metric", reported_metric(sweep, outcomes)]
    axes = sweep.spec.axis_keys
    if axes:
        words += ["--columns", axes[0]]
    if len(axes) > 1:
        words += ["--select", ",".join(axes[1:]), "--on", VALIDATION]
    if uri != tracking_uri(TrackingConfig()):  # the store report reads without --tracking-uri
        words += ["--tracking-uri", uri]
    return shlex.join(words)


def reported_metric(sweep: Sweep, outcomes: Iterable[CellOutcome]) -> str:
    """The stopping rule's metric, else the first of ``REPORTED`` a cell logged, else its first
    evaluation metric; ``METRIC`` when no cell ran now (all finished before)."""
    if sweep.spec.stopping is not None:
        return sweep.spec.stopping.metric
    logged = sorted({key for outcome in outcomes for key in outcome.final if key.startswith("eval/")})
    preferred = [key for key in REPORTED if key in logged]
    return (preferred or logged or ["METRIC"])[0]
