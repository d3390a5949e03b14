"""Preflight: an unreachable tracking store or Ray address is a ResourceError naming it, in seconds."""

import http.server
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from raysim.engine import preflight
from raysim.engine.preflight import check_output_dir, check_ray_address, check_tracking_store, host_and_port
from raysim.errors import ResourceError


def closed_port() -> int:
    """A port nothing listens on (the OS's free port, released again)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def silent_server():
    """A port that accepts connections and never answers (a hung server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


class NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    do_POST = do_GET

    def log_message(self, *args) -> None:  # quiet
        pass


@contextmanager
def http_404_server():
    """A web server that is not MLflow (nor gRPC): every GET and POST is 404."""
    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def short_timeout(monkeypatch):
    monkeypatch.setattr(preflight, "PROBE_TIMEOUT_S", 0.5)


def raises_fast(check, target: str, *fragments: str, within_s: float = 3.0) -> None:
    start = time.perf_counter()
    with pytest.raises(ResourceError) as info:
        check(target)
    assert time.perf_counter() - start < within_s
    for fragment in (target, *fragments):
        assert fragment in str(info.value)


def test_a_tracking_server_that_refuses_is_named_at_once():
    uri = f"http://127.0.0.1:{closed_port()}"
    raises_fast(check_tracking_store, uri, "refused the connection", "MLFLOW_TRACKING_URI")


def test_a_tracking_server_that_never_answers_is_named_after_the_probe_timeout(short_timeout):
    with silent_server() as port:
        raises_fast(check_tracking_store, f"http://127.0.0.1:{port}", "did not answer within 0.5 s")


def test_a_web_server_that_is_not_mlflow_is_named():
    with http_404_server() as port:
        raises_fast(check_tracking_store, f"http://127.0.0.1:{port}", "not as an MLflow server", "404",
                    within_s=15)  # fmt: skip


def test_a_sqlite_store_whose_folder_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    uri = f"sqlite:///{tmp_path / 'file' / 'runs' / 'mlflow.db'}"
    raises_fast(check_tracking_store, uri, "cannot be created", str(tmp_path / "file" / "runs"))


def test_a_sqlite_store_path_holding_another_file_or_a_folder_is_named_and_left_alone(tmp_path):
    """A 1-byte notes file became an MLflow store; a folder ended in SQLAlchemy's traceback."""
    (tmp_path / "notes.db").write_bytes(b"x")
    with pytest.raises(
        ResourceError, match=f"store {tmp_path / 'notes.db'} is a file but not a SQLite database"
    ):
        check_tracking_store(f"sqlite:///{tmp_path / 'notes.db'}")
    assert (tmp_path / "notes.db").read_bytes() == b"x"
    with pytest.raises(ResourceError, match=f"store {tmp_path} is a folder, not a SQLite database"):
        check_tracking_store(f"sqlite:///{tmp_path}")
    (tmp_path / "empty.db").write_bytes(b"")
    check_tracking_store(f"sqlite:///{tmp_path / 'empty.db'}")  # MLflow makes an empty file a store


@pytest.mark.parametrize(
    "uri, says",
    [
        ("file:///tmp/mlruns", "is MLflow's file store"),
        ("sqlite:/x.db", "is no SQLite URI"),
        ("ftp://x", "'ftp'"),
    ],
)
def test_a_uri_from_mlflow_tracking_uri_raysim_cannot_use_is_named(uri, says):
    """MLFLOW_TRACKING_URI skips the job's validation: these ended in MLflow's or SQLAlchemy's traceback."""
    raises_fast(check_tracking_store, uri, says)


def test_a_good_sqlite_store_passes_and_its_folder_exists(tmp_path):
    check_tracking_store(f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}")
    assert (tmp_path / "new").is_dir()


def test_a_database_server_that_refuses_is_named():
    uri = f"postgresql://user@127.0.0.1:{closed_port()}/runs"
    raises_fast(check_tracking_store, uri, "database server", "refused the connection")


def test_a_ray_address_that_refuses_is_named():
    for address in (f"127.0.0.1:{closed_port()}", f"ray://127.0.0.1:{closed_port()}"):
        raises_fast(check_ray_address, address, "refused the connection", "RAY_ADDRESS")


def test_a_ray_address_that_never_answers_is_no_gcs(short_timeout):
    with silent_server() as port:
        raises_fast(check_ray_address, f"127.0.0.1:{port}", "not as a Ray GCS", "deadline")


def test_a_ray_address_where_a_web_server_answers_is_no_gcs():
    """A TCP connect alone passes here (and ``ray.init`` then hangs for good)."""
    with http_404_server() as port:
        raises_fast(check_ray_address, f"127.0.0.1:{port}", "not as a Ray GCS")


def test_ray_address_forms():
    assert host_and_port("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert host_and_port("ray://head") == ("head", 10001)
    assert host_and_port("ray://head:20001") == ("head", 20001)
    assert host_and_port("[::1]:6379") == ("::1", 6379)
    for bad in ("head", "head:port"):
        with pytest.raises(ResourceError, match="is no Ray address"):
            host_and_port(bad)


def test_an_output_dir_that_is_or_lies_under_a_file_is_named_and_nothing_is_created(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ResourceError, match=f"output folder {tmp_path / 'file'} .--output-dir. is a file"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(ResourceError, match=f"lies under {tmp_path / 'file'}, which is a file"):
        check_output_dir(tmp_path / "file" / "a" / "b")
    check_output_dir(tmp_path / "new" / "out")  # missing folders are made by the run, not here
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only folder")
def test_a_read_only_output_dir_or_runs_folder_is_refused_naming_it(tmp_path):
    """A read-only runs/ inside a writable --output-dir failed with a traceback once the data was
    prepared (issue 29, item 7)."""
    read_only, inner = tmp_path / "ro", tmp_path / "ok" / "runs"
    for folder in (read_only, inner):
        folder.mkdir(parents=True)
        folder.chmod(0o555)
    try:
        for out, blocked in ((read_only, read_only), (tmp_path / "ok", inner)):
            with pytest.raises(
                ResourceError, match=f"{out} .--output-dir. cannot be written .{blocked}: Perm"
            ):
                check_output_dir(out, "runs")
    finally:
        for folder in (read_only, inner):
            folder.chmod(0o755)


def test_a_file_where_the_runs_folder_goes_is_named(tmp_path):
    (tmp_path / "runs").write_text("")
    with pytest.raises(ResourceError, match=f"holds a file {tmp_path / 'runs'} where raysim makes a folder"):
        check_output_dir(tmp_path, "runs")
    check_output_dir(tmp_path, "sweeps")  # a folder the run makes


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_dir_no_folder_can_be_made_in_is_refused_even_for_root(tmp_path):
    """/proc's permission bits let root write; making a folder there fails all the same."""
    with pytest.raises(
        ResourceError,
        match=r"/proc/x .--output-dir. cannot be written .cannot make a folder in /proc: it takes no new",
    ):  # before: "(/proc: No such file or directory)", as if /proc were missing
        check_output_dir(Path("/proc/x"))
    check_output_dir(tmp_path / "fine")
    assert list(tmp_path.iterdir()) == []  # the probe folder is gone
