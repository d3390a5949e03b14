"""The evaluation metrics a job logs, known from its config alone (before anything is built), so
that a key naming one (``sweep.stopping.metric``) is checked before any cell runs.

The global model's evaluation logs ``eval/<scope>/<name>`` for each scope the job turns on:
``central`` (the dataset's central test set, when it has one), ``clients`` (the training clients'
test splits), ``validation`` (``dataset.validation_fraction``), ``heldout``
(``evaluation.heldout_fraction``), ``transfer/<name>`` (``evaluation.transfer``), and
``personal`` (a plugin's personal models). The client scopes add the unweighted mean over clients
(``_mean``) and, for accuracy and loss, their spread (``_std``, ``_p10``, ``_p50``, ``_p90``);
personalization adds ``eval/<scope>/personalized_<pct>/<name>`` (``raysim.engine.evaluation``).
"""

from __future__ import annotations

import difflib

from raysim.config.job import JobConfig

NAMES = ("accuracy", "loss", "perplexity", "mcc", "f1", "pearson")  # what an evaluation can report
SPREAD = ("accuracy", "loss")  # names whose spread over clients is logged too
SPREAD_SUFFIXES = ("_std", "_p10", "_p50", "_p90")
SCOPE_SWITCHES = {  # a scope that is off, and the setting that turns it on
    "validation": "dataset.validation_fraction > 0",
    "heldout": "evaluation.heldout_fraction > 0",
    "transfer": "an evaluation.transfer entry",
}


def client_scopes(job: JobConfig) -> list[str]:
    """The scopes evaluated per client (each logs means and spreads)."""
    scopes = ["clients", "personal"]
    if float(job.to_dict()["dataset"].get("validation_fraction") or 0) > 0:
        scopes.append("validation")
    if job.evaluation.heldout_fraction > 0:
        scopes.append("heldout")
    return scopes + [f"transfer/{t.name}" for t in job.evaluation.transfer]


def evaluated_keys(job: JobConfig) -> list[str]:
    """Every ``eval/...`` key the job's evaluation can log."""
    keys = [f"eval/central/{name}" for name in NAMES]
    for scope in client_scopes(job):
        for name in NAMES:
            keys += [f"eval/{scope}/{name}", f"eval/{scope}/{name}_mean"]
            keys += [f"eval/{scope}/{name}{s}" for s in SPREAD_SUFFIXES if name in SPREAD]
    personalization = job.evaluation.personalization
    if personalization is not None:
        scope = "heldout" if job.evaluation.heldout_fraction > 0 else "clients"
        for fraction in personalization.fractions:
            tag = f"personalized_{round(fraction * 100)}"
            keys += [f"eval/{scope}/{tag}/{name}" for name in SPREAD]
    return keys


def check_evaluated(key: str, metric: str, job: JobConfig) -> str | None:
    """A problem line when ``metric`` is not an evaluation metric ``job`` logs, naming the nearest
    one it does (and the setting that would log it); None when it is one."""
    keys = evaluated_keys(job)
    if metric in keys:
        return None
    close = difflib.get_close_matches(metric, keys, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else " (e.g. eval/central/accuracy, eval/clients/loss)"
    scope = metric.removeprefix("eval/").split("/")[0]
    switch = f" (eval/{scope}/... needs {SCOPE_SWITCHES[scope]})" if scope in SCOPE_SWITCHES else ""
    return f"{key}: {metric!r} is not an evaluation metric this job logs{switch}{hint}"
