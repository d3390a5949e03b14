"""The outbox: records wait, in order, while the MLflow store is away or full, with a bounded
backoff between attempts; said once each way; saved to the run folder and uploaded exactly once.

A fake store (a list that refuses while ``away`` is set) and a hand-moved clock: nothing sleeps.
"""

import json
import sys
from pathlib import Path

import pytest
import requests
from mlflow.exceptions import MlflowException

from raysim.errors import ResourceError
from raysim.tracking import store_calls
from raysim.tracking.outbox import (
    FIRST_RETRY_S,
    MAX_RETRY_S,
    UNSENT_FILE,
    UPLOADED_FILE,
    ArtifactRecord,
    EndRecord,
    MetricsRecord,
    Outbox,
    ParamsRecord,
    one_attempt,
    outage_reason,
)
from raysim.tracking.store_calls import HTTP_DEFAULTS
from raysim.tracking.unsent import read_unsent, upload

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/mlflow_failures.py
from mlflow_failures import artifacts_full, database_full, server_gone  # noqa: E402


class FakeStore:
    """Takes records into ``taken``; while ``failure`` is set, raises it instead."""

    def __init__(self) -> None:
        self.taken: list = []
        self.attempts = 0
        self.failure: BaseException | None = None

    def deliver(self, record) -> None:
        self.attempts += 1
        if self.failure is not None:
            raise self.failure
        self.taken.append(record)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def metrics(step: int) -> MetricsRecord:
    return MetricsRecord(step, 1000 + step, {"train/loss": 1.0 / (step + 1)})


def outage_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("tracking:")]


def test_records_wait_while_the_store_is_away_and_go_in_order_when_it_is_back(caplog):
    store, clock = FakeStore(), Clock()
    outbox = Outbox(store.deliver, "http://tracking:5000", clock)
    outbox.send(metrics(0))
    store.failure = server_gone()
    outbox.send(metrics(1))  # refused: the store is away
    for step in (2, 3):  # within the backoff: not even tried
        outbox.send(metrics(step))
    assert store.attempts == 2 and [r.step for r in store.taken] == [0]
    clock.now = FIRST_RETRY_S
    outbox.send(metrics(4))  # tried again once, refused again
    assert store.attempts == 3
    store.failure = None
    clock.now += 2 * FIRST_RETRY_S
    outbox.send(metrics(5))
    assert [r.step for r in store.taken] == [0, 1, 2, 3, 4, 5]  # in the order they were logged
    assert [r.timestamp for r in store.taken] == [1000 + step for step in range(6)]  # as logged
    away, back = outage_lines(caplog)  # said once each way, in one line
    assert "http://tracking:5000 cannot take records (no connection)" in away and "\n" not in away
    assert "is back; 5 waiting records sent" in back


def test_the_wait_between_attempts_doubles_up_to_a_minute():
    store, clock = FakeStore(), Clock()
    outbox = Outbox(store.deliver, "uri", clock)
    store.failure = server_gone()
    tried_at = []
    while clock.now < 400:
        before = store.attempts
        outbox.send(metrics(0))
        if store.attempts > before:
            tried_at.append(clock.now)
        clock.now += 1
    gaps = [b - a for a, b in zip(tried_at, tried_at[1:], strict=False)]
    assert gaps[:6] == [2, 4, 8, 16, 32, MAX_RETRY_S] and set(gaps[5:]) == {MAX_RETRY_S}


def test_a_record_the_store_rejects_for_itself_raises_as_before():
    store = FakeStore()
    outbox = Outbox(store.deliver, "uri", Clock())
    store.failure = MlflowException("Invalid metric value", error_code="INVALID_PARAMETER_VALUE")
    with pytest.raises(MlflowException, match="Invalid metric"):
        outbox.send(metrics(0))
    store.failure = None
    outbox.send(metrics(1))  # the rejected record is not sent again
    assert [r.step for r in store.taken] == [1]


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (server_gone(), "no connection"),
        (database_full(), "database or disk is full"),
        (artifacts_full(), "No space left on device"),
        (MlflowException("API request failed with timeout exception"), None),  # no cause: not known
        (requests.exceptions.ReadTimeout("read timed out"), "no answer in time"),
        (requests.exceptions.RetryError("too many 503s"), "it kept answering that it is unavailable"),
        (ValueError("a bug"), None),
        (FileNotFoundError(2, "No such file"), None),
    ],
)
def test_outages_are_told_from_errors(failure, reason):
    assert outage_reason(failure) == reason


def test_an_attempt_while_the_store_is_away_is_one_try_and_an_artifact_waits_by_its_size(
    tmp_path, monkeypatch
):
    """MLflow reads these at each call. While the store is away, the outbox itself tries again (after
    its backoff): MLflow's own retry would double what a hung server costs at each attempt."""
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES as RETRIES
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_TIMEOUT as TIMEOUT

    for name in HTTP_DEFAULTS:
        monkeypatch.setenv(name, "")  # so that teardown restores it as it was
        monkeypatch.delenv(name)
    monkeypatch.setattr(store_calls, "_SET_BY_RAYSIM", set())
    checkpoint = tmp_path / "final.pt"
    checkpoint.write_bytes(bytes(25 * 2**20))
    with one_attempt(metrics(0)):
        assert (RETRIES.get(), TIMEOUT.get()) == (1, 10)
    with one_attempt(metrics(0), is_away=True):
        assert (RETRIES.get(), TIMEOUT.get()) == (0, 10)
    with one_attempt(ArtifactRecord(str(checkpoint), None)):  # a server may store it elsewhere first
        assert (RETRIES.get(), TIMEOUT.get()) == (1, 10 + 2)
    assert (RETRIES.get(), TIMEOUT.get()) == (1, 10)  # raysim's bound, for its every other call
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    with one_attempt(ArtifactRecord(str(checkpoint), None), is_away=True):
        assert (RETRIES.get(), TIMEOUT.get()) == (3, 30)  # the user's settings stay


def unsent_run(tmp_path, caplog) -> Path:
    """A run folder whose store went away after step 0 and never came back."""
    store = FakeStore()
    outbox = Outbox(store.deliver, "http://tracking:5000", Clock())
    outbox.send(ParamsRecord({"seed": "1"}))
    store.failure = database_full()
    for step in (0, 1, 2):
        outbox.send(metrics(step))
    outbox.send(ArtifactRecord(str(tmp_path / "final.pt"), None))
    (tmp_path / "final.pt").write_bytes(b"model")
    assert not outbox.close(EndRecord("FINISHED"))
    path = outbox.save(tmp_path, "run123")
    assert path == tmp_path / UNSENT_FILE
    [line] = [m for m in outage_lines(caplog) if "still" in m]
    what = "5 records (metrics of steps 0 to 2, 1 artifacts, the run's end)"
    assert line.endswith(f"{what} not sent, saved in {path}; send them with: raysim track upload {tmp_path}")
    return tmp_path


def test_what_never_went_is_saved_as_json_lines_and_uploaded_once(tmp_path, caplog):
    folder = unsent_run(tmp_path, caplog)
    lines = [json.loads(line) for line in (folder / UNSENT_FILE).read_text().splitlines()]
    assert lines[0] == {"run_id": "run123", "tracking_uri": "http://tracking:5000"}
    first = {"seq": 0, "kind": "metrics", "step": 0, "timestamp": 1000, "metrics": {"train/loss": 1.0}}
    assert lines[1] == first
    assert [line["kind"] for line in lines[1:]] == ["metrics"] * 3 + ["artifact", "end"]
    unsent = read_unsent(folder)
    assert (unsent.run_id, unsent.tracking_uri) == ("run123", "http://tracking:5000")
    later = FakeStore()
    assert upload(unsent, later.deliver) == 5
    assert later.taken == [metrics(0), metrics(1), metrics(2), ArtifactRecord(str(folder / "final.pt"), None),
                           EndRecord("FINISHED")]  # fmt: skip
    assert not (folder / UNSENT_FILE).exists() and (folder / UPLOADED_FILE).is_file()
    assert upload(read_unsent(folder), later.deliver) == 0  # again: nothing twice
    assert len(later.taken) == 5


def test_an_upload_cut_short_goes_on_after_the_last_record_sent(tmp_path, caplog):
    folder = unsent_run(tmp_path, caplog)
    flaky = FakeStore()
    original = flaky.deliver

    def fail_on_the_third(record):
        if flaky.attempts == 2:
            flaky.failure = server_gone()
        original(record)

    with pytest.raises(ResourceError, match=r"still cannot take records \(no connection\): 2 of 5 sent; run"):
        upload(read_unsent(folder), fail_on_the_third)
    with (folder / UNSENT_FILE).open("a") as torn:  # a crash in the middle of noting one as sent
        torn.write('{"se')
    flaky.failure = None
    assert upload(read_unsent(folder), flaky.deliver) == 3
    assert [type(r).__name__ for r in flaky.taken] == ["MetricsRecord"] * 3 + ["ArtifactRecord", "EndRecord"]


def test_a_folder_without_unsent_records_is_named(tmp_path):
    with pytest.raises(ResourceError, match=f"{tmp_path} holds no {UNSENT_FILE}"):
        read_unsent(tmp_path)
