"""A run folder's unsent MLflow records (``outbox.UNSENT_FILE``), read and sent once by
``raysim track upload``.

Every line is checked before anything is sent, so a file edited by hand or written by another
program is refused naming its line, not half uploaded. One upload of a folder runs at a time: it
holds an exclusive ``flock`` of the file (the OS drops it when its holder dies), and a second is
refused; each record sent is noted in the file, so an upload cut short goes on where it stopped.

Usage:
    with claimed(folder):
        unsent = read_unsent(folder)
        upload(unsent, tracker.deliver)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.errors import ResourceError
from raysim.tracking.outbox import (
    KINDS,
    UNSENT_FILE,
    UPLOADED_FILE,
    ArtifactRecord,
    Record,
    one_attempt,
    outage_reason,
)


@dataclass(frozen=True)
class MappingOf:
    """A JSON object of names to values of ``values``' type."""

    values: Any


NUMBER = (int, float)
# Each kind's fields and what they hold, and how an error names that.
FIELDS: dict[str, dict[str, Any]] = {
    "metrics": {"seq": int, "step": int, "timestamp": int, "metrics": MappingOf(NUMBER)},
    "params": {"seq": int, "params": MappingOf(str)},
    "artifact": {"seq": int, "path": str, "artifact_dir": (str, type(None))},
    "end": {"seq": int, "status": str},
}
WORDS = {
    int: "a whole number",
    str: "text",
    (str, type(None)): "text or null",
    MappingOf(NUMBER): "names mapped to numbers",
    MappingOf(str): "names mapped to text",
}
END_STATUSES = ("FINISHED", "FAILED", "KILLED")
TORN_MARK = '{"sent": '  # how a note of a record sent starts: cut short by a crash, it is skipped
NOT_RAYSIMS = "raysim did not write it so: restore the run's own file"


@dataclass(frozen=True)
class UnsentRecords:
    """A run folder's ``UNSENT_FILE``: the run and store it names, the records not yet sent."""

    path: Path
    run_id: str
    tracking_uri: str
    records: list[tuple[int, Record]]  # (seq, record), in the order they were logged


def unsent_file(folder: Path) -> Path:
    """``folder``'s ``UNSENT_FILE``, else its ``UPLOADED_FILE`` (everything in it was sent).

    Raises:
        ResourceError: the folder holds neither.
    """
    path = next((p for p in (folder / UNSENT_FILE, folder / UPLOADED_FILE) if p.is_file()), None)
    if path is None:
        raise ResourceError(f"{folder} holds no {UNSENT_FILE}: nothing to upload (is it a run folder?)")
    return path


@contextlib.contextmanager
def claimed(folder: Path) -> Iterator[None]:
    """Holds ``folder``'s upload: an exclusive flock of its unsent file.

    Raises:
        ResourceError: another upload of the folder holds it.
    """
    path = unsent_file(folder)
    with path.open("rb") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ResourceError(
                f"another `raysim track upload` is sending {path}; let it end (and run this again "
                f"if it fails: it sends only what is left)"
            ) from None
        yield  # read the file after this: an upload that ended meanwhile renamed it


def read_unsent(folder: Path) -> UnsentRecords:
    """The records of ``folder``'s unsent file that no ``{"sent": SEQ}`` line marks as sent
    (none, once it became ``UPLOADED_FILE``), each line checked.

    Raises:
        ResourceError: no such file, or a line that is not what raysim writes (named by number).
    """
    path = unsent_file(folder)
    lines: list[tuple[int, dict[str, Any]]] = []
    try:
        content = path.read_text()
    except UnicodeDecodeError as exc:
        raise ResourceError(f"{path}: not UTF-8 text (byte {exc.start}); {NOT_RAYSIMS}") from None
    for number, text in enumerate(content.splitlines(), start=1):
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            if TORN_MARK.startswith(text) or text.startswith(TORN_MARK):  # torn by a crash: sent again
                continue
            raise ResourceError(f"{path}, line {number}: not JSON ({text[:60]!r}); {NOT_RAYSIMS}") from None
        if not isinstance(line, dict):
            raise ResourceError(f"{path}, line {number}: not a JSON object; {NOT_RAYSIMS}")
        lines.append((number, line))
    header = lines[0][1] if lines else {}
    if not all(isinstance(header.get(key), str) for key in ("run_id", "tracking_uri")):
        raise ResourceError(f"{path} names no MLflow run and store on its first line; {NOT_RAYSIMS}")
    sent = {line["sent"] for _, line in lines[1:] if "sent" in line}
    records = [record_of(path, number, line) for number, line in lines[1:] if "sent" not in line]
    unsent = [(seq, record) for seq, record in records if seq not in sent]
    return UnsentRecords(path, header["run_id"], header["tracking_uri"], unsent)


def record_of(path: Path, number: int, line: dict[str, Any]) -> tuple[int, Record]:
    """Line ``number`` of ``path`` as (seq, record), its kind and every field checked."""
    where, kind = f"{path}, line {number}", line.pop("kind", None)
    if kind not in KINDS:
        known = ", ".join(KINDS)
        raise ResourceError(f"{where}: unknown record kind {kind!r} (raysim writes {known}); {NOT_RAYSIMS}")
    problem = field_problem(line, FIELDS[kind])
    if kind == "end" and not problem and line["status"] not in END_STATUSES:
        problem = f"status {line['status']!r} is none of {', '.join(END_STATUSES)}"
    if problem:
        raise ResourceError(f"{where}: the {kind} record's {problem}; {NOT_RAYSIMS}")
    seq = line.pop("seq")
    return seq, KINDS[kind](**line)


def field_problem(fields: dict[str, Any], expected: dict[str, Any]) -> str:
    """What is wrong with a record's fields, "" when nothing is."""
    if set(fields) != set(expected):
        return f"fields are {', '.join(sorted(fields))}, not {', '.join(sorted(expected))}"
    wrong = next((name for name, kind in expected.items() if not holds(fields[name], kind)), None)
    return "" if wrong is None else f"{wrong} {str(fields[wrong])[:60]!r} is not {WORDS[expected[wrong]]}"


def holds(value: Any, kind: Any) -> bool:
    """``value`` is of ``kind`` as JSON reads it (true and false are no numbers)."""
    if isinstance(kind, MappingOf):
        return isinstance(value, dict) and all(holds(v, kind.values) for v in value.values())
    return isinstance(value, kind) and not isinstance(value, bool)


def upload(unsent: UnsentRecords, deliver: Callable[[Record], None]) -> int:
    """Sends the records in order, noting each one sent in the file; renames the file to
    ``UPLOADED_FILE`` once all are. Returns how many were sent.

    Raises:
        ResourceError: the store still cannot take them (those sent stay noted: run it again), or
            refused one for itself (named by its seq).
    """
    with unsent.path.open("a") as marks:
        if not unsent.path.read_text().endswith("\n"):  # a mark torn by a crash ends its line here
            marks.write("\n")
        for num_sent, (seq, record) in enumerate(unsent.records):
            if isinstance(record, ArtifactRecord) and not Path(record.path).is_file():
                raise ResourceError(f"{record.path}, an artifact of the run, is gone; it cannot be uploaded")
            try:
                with one_attempt(record):
                    deliver(record)
            except Exception as exc:
                reason = outage_reason(exc)
                if reason is None:
                    raise ResourceError(
                        f"the MLflow store {unsent.tracking_uri} refused record {seq} of {unsent.path} "
                        f"({type(exc).__name__}: {str(exc)[:200]}); {num_sent} of "
                        f"{len(unsent.records)} sent"
                    ) from exc
                raise ResourceError(
                    f"the MLflow store {unsent.tracking_uri} still cannot take records ({reason}): "
                    f"{num_sent} of {len(unsent.records)} sent; run this again later"
                ) from None
            marks.write(json.dumps({"sent": seq}) + "\n")
            marks.flush()
            os.fsync(marks.fileno())
    os.replace(unsent.path, unsent.path.with_name(UPLOADED_FILE))
    return len(unsent.records)
