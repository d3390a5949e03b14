"""The Ray Jobs client side of `raysim submit`: the token where Ray keeps it, a cluster that does
not answer or refuses us failing in seconds with a message, log following, the upload's size."""

from __future__ import annotations

import asyncio
import http.server
import io
import os
import signal
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from raysim.cli import ray_jobs
from raysim.cli.submit import EXCLUDES, check_upload_size
from raysim.errors import RaysimError


def test_the_token_is_found_where_ray_looks_in_rays_order(tmp_path):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("home-token\n")
    (tmp_path / "named").write_text("named-token")
    assert ray_jobs.auth_token({}, home) == "home-token"
    assert ray_jobs.auth_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "named")}, home) == "named-token"
    both = {"RAY_AUTH_TOKEN": "env-token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "named")}
    assert ray_jobs.auth_token(both, home) == "env-token"
    assert ray_jobs.auth_token({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x"}, home) is None
    assert ray_jobs.auth_token({}, tmp_path / "nobody") is None
    with pytest.raises(RaysimError, match="RAY_AUTH_TOKEN_PATH=.*missing names no file"):
        ray_jobs.auth_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}, home)


def test_an_auth_error_says_what_was_sent_and_where_the_token_goes():
    url = "http://h:8265"
    assert "no token was found here" in ray_jobs.auth_error(url, None, {})
    assert "RAY_AUTH_MODE=disabled is set here" in ray_jobs.auth_error(
        url, None, {"RAY_AUTH_MODE": "disabled"}
    )
    assert "refused the token in ~/.ray/auth_token" in ray_jobs.auth_error(url, "t", {})
    assert "refused the token of RAY_AUTH_TOKEN" in ray_jobs.auth_error(url, "t", {"RAY_AUTH_TOKEN": "t"})
    assert "`ray get-auth-token` on the head" in ray_jobs.auth_error(url, "t", {})


class _JobApi(http.server.BaseHTTPRequestHandler):
    """Answers GET /api/version with the status the test sets; records the Authorization header."""

    status = 200
    seen: list[str | None] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).seen.append(self.headers.get("Authorization"))
        body = b'{"ray_version": "2.60.0"}' if self.status == 200 else b"no"
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def job_api():
    server = http.server.HTTPServer(("127.0.0.1", 0), _JobApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _JobApi.seen, _JobApi.status = [], 200
    yield f"http://127.0.0.1:{server.server_address[1]}", _JobApi
    server.shutdown()


def test_the_probe_sends_the_token_and_tells_refusals_and_strangers_apart(job_api, monkeypatch):
    url, api = job_api
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    ray_jobs.probe(url, "tok")
    assert api.seen == ["Bearer tok"]
    api.status = 401
    with pytest.raises(RaysimError, match="requires token authentication"):
        ray_jobs.probe(url, None)
    api.status = 404
    with pytest.raises(RaysimError, match="answers \\(HTTP 404\\) but is no Ray dashboard"):
        ray_jobs.probe(url, None)


def test_nothing_listening_or_a_silent_host_fails_within_the_timeout():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts (the kernel does) but never answers
    try:
        for sock, reason in ((closed, "cannot connect"), (silent, "no answer")):
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            start = time.monotonic()
            with pytest.raises(RaysimError, match=f"no Ray cluster answers at {url} \\({reason}"):
                ray_jobs.probe(url, None, timeout_s=0.5)
            assert time.monotonic() - start < 3
    finally:
        closed.close()
        silent.close()


class FakeClient:
    """The slice of ``JobSubmissionClient`` that ``follow`` uses: a log stream, then a status."""

    def __init__(self, chunks, statuses, broken=False, interrupted=False, ctrl_c=False):
        self.chunks, self.statuses = chunks, list(statuses)
        self.broken, self.interrupted, self.ctrl_c = broken, interrupted, ctrl_c

    async def tail_job_logs(self, job_id):
        for chunk in self.chunks:
            await asyncio.sleep(0)
            yield chunk
        if self.broken:
            raise RuntimeError("connection closed")
        if self.ctrl_c:  # a real Ctrl-C while waiting for the next chunk, the cancellation swallowed
            os.kill(os.getpid(), signal.SIGINT)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return  # as a log client that ends its stream quietly on cancellation
        if self.interrupted:  # Ctrl-C as Python hands it on from a class body being built
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as stop:
                raise RuntimeError("Error calling __set_name__ on 'Field' instance") from stop

    def get_job_status(self, job_id):
        value = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return SimpleNamespace(value=value, is_terminal=lambda: value in ("SUCCEEDED", "FAILED", "STOPPED"))

    def get_job_info(self, job_id):
        return SimpleNamespace(message="done")


def test_follow_streams_the_logs_and_returns_the_final_status():
    out = io.StringIO()
    assert ray_jobs.follow(FakeClient(["a\n", "b\n"], ["SUCCEEDED"]), "j", out) == ("SUCCEEDED", "done")
    assert out.getvalue() == "a\nb\n"


def test_a_broken_stream_still_waits_for_the_jobs_end(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    client = FakeClient(["a\n"], ["RUNNING", "RUNNING", "FAILED"], broken=True)
    assert ray_jobs.follow(client, "j", io.StringIO()) == ("FAILED", "done")


def test_ctrl_c_wrapped_in_a_runtime_error_stops_following(monkeypatch):
    """Not a broken stream: following stops at once (raysim submit then says the job goes on),
    it does not wait for the job's end."""
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("waited for the job"))
    with pytest.raises(KeyboardInterrupt):
        ray_jobs.follow(FakeClient(["a\n"], ["RUNNING"], interrupted=True), "j", io.StringIO())


def test_ctrl_c_stops_following_even_when_the_log_client_swallows_it(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("waited for the job"))
    with pytest.raises(KeyboardInterrupt):
        ray_jobs.follow(FakeClient(["a\n"], ["RUNNING"], ctrl_c=True), "j", io.StringIO())


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_the_upload_counts_what_ray_would_pack(tmp_path):
    """EXCLUDES, a .gitignore at the top and a .rayignore further down, applied as Ray applies them."""
    write(tmp_path / "raysim" / "a.py", 100)
    write(tmp_path / "jobs" / "x.yaml", 10)
    write(tmp_path / "jobs" / "deep" / "big.bin", 1000)
    (tmp_path / "jobs" / ".rayignore").write_text("deep/\n")
    write(tmp_path / "data" / "store.arrow", 5000)
    (tmp_path / ".gitignore").write_text("data/\n")
    excluded = [".git/objects/p", ".venv/lib/t.so", "venv/x", "raysim/__pycache__/a.pyc", ".raysim/runs/c"]
    excluded += ["mlruns/0/m", "mlflow.db", "mlflow.db.lock", "mlartifacts/a", "init.pt", "w/final.pt"]
    for path in excluded:
        write(tmp_path / path, 10_000)
    sizes = ray_jobs.upload_sizes(tmp_path, EXCLUDES)
    assert sizes == {"raysim": 100, "jobs": 10 + len("deep/\n"), ".gitignore": len("data/\n")}


def test_an_upload_over_rays_limit_names_its_biggest_entries(tmp_path):
    write(tmp_path / "datasets_raw" / "a.bin", 3 * 1024**2)
    write(tmp_path / "notes" / "n.txt", 1024**2)
    write(tmp_path / "model.pt", 50 * 1024**2)  # excluded: not counted
    check_upload_size(tmp_path, limit=5 * 1024**2)
    with pytest.raises(RaysimError, match=r"4\.0 MiB .* over Ray's limit of 2\.0 MiB; the biggest: "
                       r"datasets_raw \(3\.0 MiB\), notes \(1\.0 MiB\)\. .*\.rayignore"):  # fmt: skip
        check_upload_size(tmp_path, limit=2 * 1024**2)
