"""The checks a run makes before its workers start, for ``raysim run --dry-run``: the same calls
(``open_parts`` and the algorithm's ``init``) as ``build``, so the two cannot drift.

They need the job's data, which a dry run neither downloads nor builds: when a dataset's store
(or a transfer dataset's) is not prepared yet, the checks are skipped and the reason is returned.
What they catch: a model that does not fit the data, a plugin's model check (DENSE needs
BatchNorm for its statistics loss), the algorithm's ``init`` (FedBN keeps BatchNorm layers local,
so a model without any fails there), vectorize, DP-SGD and probe checks.
"""

from __future__ import annotations

from pydantic import BaseModel

from raysim.config import JobConfig
from raysim.config.plugins import section_config
from raysim.data.format import is_complete
from raysim.data.prepare import store_path
from raysim.data.store import ClientStore, DatasetConfig
from raysim.engine.build import open_parts
from raysim.plugin_defaults import fresh_state


def check_start(job: JobConfig) -> ClientStore | str:
    """Runs the job's start checks; returns its training store, or why they were skipped.

    Raises:
        ConfigError: what the run would refuse at its start, worded as there.
    """
    missing = unprepared(job)
    if missing:
        return f"skipped: dataset {missing} is not prepared (raysim prepare JOB.yaml, then dry-run again)"
    parts = open_parts(job)
    fresh_state(parts.algorithm, parts.params, parts.info)  # FedBN: a model without BatchNorm
    return parts.store


def unprepared(job: JobConfig) -> str | None:
    """The name of the first of the job's datasets without a complete store; None when all have one."""
    datasets: list[tuple[str, BaseModel]] = [(job.dataset.name, job.dataset.config)]
    for i, transfer in enumerate(job.evaluation.transfer):
        where = f"evaluation.transfer[{i}].dataset."
        datasets.append((str(transfer.dataset["name"]), section_config("dataset", transfer.dataset, where)))
    for name, config in datasets:
        assert isinstance(config, DatasetConfig)  # registry.register refuses other dataset Configs
        if not is_complete(store_path(name, config)):
            return name
    return None
