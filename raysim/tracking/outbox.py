"""What the MLflow store could not take yet: records wait here, in order, while it is away.

A tracking server that dies, or a store whose disk is full, does not stop training. A record the
store refuses for such a reason (``is_outage``) waits in memory with every record after it; the
next attempt comes after a backoff (2 s, doubling to 60 s), so a round waits at most for one
attempt, which costs seconds, not minutes (``raysim.tracking.store_calls``; while the store is
away, an attempt is one try, without MLflow's own retry: ``one_attempt``). The user is told once
that the store is away and once that it is back; what waited is then sent in order. A record the
store rejects for any other reason (a bad value) raises, as it always did.

Still waiting when the run ends, the records are saved in the run folder as ``UNSENT_FILE``
(JSON lines: a header naming the run and its store, then one record per line), and
``raysim track upload RUN_FOLDER`` sends them later to the same MLflow run, noting each one sent
(a ``{"sent": SEQ}`` line), so that uploading twice sends nothing twice (``raysim.tracking.unsent``).

Usage:
    outbox = Outbox(tracker.deliver, tracker.uri)
    outbox.send(MetricsRecord.now({"train/loss": 0.3}, step=0))
    if not outbox.close(EndRecord("FINISHED")):
        outbox.save(run_dir, tracker.run_id)
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raysim.errors import ResourceError
from raysim.tracking.store_calls import HTTP_DEFAULTS, RETRIES, TIMEOUT, call_settings
from raysim.types import Metrics

log = logging.getLogger("raysim")

UNSENT_FILE = "tracking_unsent.jsonl"  # in the run folder: what the store did not take
UPLOADED_FILE = "tracking_uploaded.jsonl"  # the same file once every record in it was sent
# `raysim run`'s exit status when a run finished (checkpoint written) but its store did not take
# everything: not 1 (training failed) nor 0 (everything logged)
UNSENT_EXIT_CODE = 3
FIRST_RETRY_S, MAX_RETRY_S = 2.0, 60.0
# A server that stores a large artifact elsewhere (S3, say) answers once it is stored: an upload
# waits 1 s longer for its answer per 10 MiB it sends.
ARTIFACT_BYTES_PER_S = 10 * 2**20
# Loggers that narrate a failed call: urllib3's "Retrying ..." lines, MLflow's traceback of a
# database error. The outbox says it in one line instead.
NOISY_LOGGERS = ("urllib3.connectionpool", "mlflow.store.db.utils")
FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class MetricsRecord:
    step: int
    timestamp: int  # ms since the epoch, when it was logged (MLflow's metric timestamp)
    metrics: dict[str, float]

    @classmethod
    def now(cls, metrics: Metrics, step: int) -> MetricsRecord:
        return cls(step, int(time.time() * 1000), {k: float(v) for k, v in metrics.items()})


@dataclass(frozen=True)
class ParamsRecord:
    params: dict[str, str]


@dataclass(frozen=True)
class ArtifactRecord:
    path: str
    artifact_dir: str | None


@dataclass(frozen=True)
class EndRecord:
    status: str  # FINISHED, FAILED or KILLED: the MLflow run's status once it ends


Record = MetricsRecord | ParamsRecord | ArtifactRecord | EndRecord
KINDS: dict[str, type[Record]] = {
    "metrics": MetricsRecord, "params": ParamsRecord, "artifact": ArtifactRecord, "end": EndRecord
}  # fmt: skip


def causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def outage_reason(exc: BaseException) -> str | None:
    """Why the store cannot take records now, in a few words (the innermost cause that says);
    None when it refused the record itself (a bad value, a run that is gone): a real error."""
    found = [reason for reason in map(_outage_reason, causes(exc)) if reason is not None]
    return found[-1] if found else None


def _outage_reason(exc: BaseException) -> str | None:
    import requests

    if isinstance(exc, sqlite3.OperationalError):  # database or disk is full, locked
        return str(exc)
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return os.strerror(exc.errno)
    if isinstance(exc, (requests.Timeout, TimeoutError)):
        return "no answer in time"
    if isinstance(exc, (requests.ConnectionError, ConnectionError)):
        return "no connection"
    if isinstance(exc, requests.exceptions.RetryError):
        return "it kept answering that it is unavailable"
    if getattr(exc, "error_code", None) == "TEMPORARILY_UNAVAILABLE":  # MLflow's database errors
        return "temporarily unavailable"
    return None


@contextlib.contextmanager
def one_attempt(record: Record, is_away: bool = False) -> Iterator[None]:
    """The calls that send ``record``, once: without MLflow's own retry while the store is known to
    be away (the outbox tries again after its backoff), an artifact's answer awaited longer the
    larger it is, and MLflow's retry and database error logs silenced. Settings the user made stay
    (``raysim.tracking.store_calls``)."""
    settings = {RETRIES: "0"} if is_away else {}
    if isinstance(record, ArtifactRecord):
        size = os.path.getsize(record.path) if os.path.isfile(record.path) else 0
        settings[TIMEOUT] = str(int(HTTP_DEFAULTS[TIMEOUT]) + size // ARTIFACT_BYTES_PER_S)
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with call_settings(**settings):
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@contextlib.contextmanager
def outage_as_error(store: str, doing: str, fix: str = "run with tracking.enabled=false") -> Iterator[None]:
    """An outage while ``doing`` what cannot wait (starting the run, listing runs) as one
    ``ResourceError`` naming ``fix`` beside freeing the disk or starting the server."""
    try:
        yield
    except Exception as exc:
        reason = outage_reason(exc)
        if reason is None:
            raise
        raise ResourceError(
            f"the MLflow store {store} cannot {doing} ({reason}): free space on its disk or start its "
            f"server, or {fix}"
        ) from None


class Outbox:
    """Records on their way to the store, sent in order; held back while it is away."""

    def __init__(
        self, deliver: Callable[[Record], None], store: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.deliver, self.store, self.clock = deliver, store, clock
        self.pending: list[Record] = []
        self.reason: str | None = None  # why the store is away; None while it takes records
        self.retry_at = 0.0
        self.delay = FIRST_RETRY_S

    def send(self, record: Record) -> None:
        """Sends the record after those waiting before it; keeps it when the store is away."""
        self.pending.append(record)
        if self.reason is None or self.clock() >= self.retry_at:
            self.flush()

    def close(self, record: EndRecord) -> bool:
        """Sends the run's end after everything waiting, trying once more whatever the backoff;
        True when the store took it all."""
        self.pending.append(record)
        return self.flush()

    def flush(self) -> bool:
        """Sends what waits, in order, until the store refuses; True when nothing is left."""
        was_away, num_sent = self.reason is not None, len(self.pending)
        while self.pending:
            try:
                with one_attempt(self.pending[0], is_away=self.reason is not None):
                    self.deliver(self.pending[0])
            except Exception as exc:
                reason = outage_reason(exc)
                if reason is None:  # refused for itself: an error, as without the outbox
                    self.pending.pop(0)
                    raise
                self._away(reason)
                return False
            self.pending.pop(0)
        if was_away:
            log.warning(
                "tracking: the MLflow store %s is back; %d waiting records sent", self.store, num_sent
            )
        self.reason, self.delay = None, FIRST_RETRY_S
        return True

    def _away(self, reason: str) -> None:
        if self.reason is None:  # said once per outage
            log.warning(
                "tracking: the MLflow store %s cannot take records (%s); training goes on and what it "
                "logs waits here until the store is back",
                self.store,
                reason,
            )
        else:
            self.delay = min(2 * self.delay, MAX_RETRY_S)
        self.reason, self.retry_at = reason, self.clock() + self.delay

    def save(self, folder: Path, run_id: str) -> Path:
        """Writes what still waits to ``folder/UNSENT_FILE`` (atomically, after any records an
        earlier leg of the run left there), says so in one line, and returns the file."""
        path = folder / UNSENT_FILE
        lines = path.read_text().splitlines() if path.is_file() else [json.dumps(header(run_id, self.store))]
        first = sum('"kind": ' in line for line in lines[1:])  # seq goes on after an earlier leg's
        lines += [json.dumps(line_of(first + i, record)) for i, record in enumerate(self.pending)]
        folder.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(path.name + ".tmp")
        with scratch.open("w") as out:
            out.write("\n".join(lines) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(scratch, path)
        log.warning(
            "tracking: the MLflow store %s still cannot take records (%s); %s not sent, saved in %s; "
            "send them with: raysim track upload %s",
            self.store,
            self.reason,
            summary(self.pending),
            path,
            folder,
        )
        return path


def has_unsent(folder: Path) -> bool:
    """The run folder holds records its store did not take (``raysim track upload`` sends them)."""
    return (folder / UNSENT_FILE).is_file()


def header(run_id: str, store: str) -> dict[str, Any]:
    return {"run_id": run_id, "tracking_uri": store}


def line_of(seq: int, record: Record) -> dict[str, Any]:
    kind = next(name for name, cls in KINDS.items() if isinstance(record, cls))
    return {"seq": seq, "kind": kind, **asdict(record)}


def summary(records: list[Record]) -> str:
    """What records hold: ``5 records (metrics of steps 2 to 4, 2 artifacts, the run's end)``."""
    steps = sorted({r.step for r in records if isinstance(r, MetricsRecord)})
    num_params = sum(len(r.params) for r in records if isinstance(r, ParamsRecord))
    num_artifacts = sum(isinstance(r, ArtifactRecord) for r in records)
    parts = [
        f"metrics of steps {steps[0]} to {steps[-1]}" if steps else "",
        f"{num_params} params" if num_params else "",
        f"{num_artifacts} artifacts" if num_artifacts else "",
        "the run's end" if any(isinstance(r, EndRecord) for r in records) else "",
    ]
    return f"{len(records)} records ({', '.join(p for p in parts if p)})"
