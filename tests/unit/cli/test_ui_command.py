"""`raysim ui` / `raysim server` without starting MLflow: the commands they would run, the
addresses they print, their errors, and how they stop a process group.
(tests/integration/tracking/test_mlflow_ui.py starts real servers.)"""

import socket
import subprocess
import time

from raysim.cli import ui
from raysim.cli.main import main


def group_alive(pgid):
    """A process of the group that is not a zombie (killed, not yet reaped by init)."""
    table = subprocess.run(["ps", "-eo", "pgid=,stat="], capture_output=True, text=True).stdout
    return any(
        int(g) == pgid and not s.startswith("Z") for g, s in (row.split() for row in table.splitlines())
    )


def test_ui_serves_a_sqlite_store_with_one_worker_and_its_artifacts_beside_it(capsys):
    assert main(["ui", "--dry-run", "--port", "5001", "--tracking-uri", "sqlite:////x/runs/mlflow.db"]) == 0
    command = capsys.readouterr().out
    assert "server --backend-store-uri sqlite:////x/runs/mlflow.db --host 127.0.0.1 --port 5001" in command
    assert "--workers 1 --default-artifact-root file:///x/runs/mlruns" in command


def test_a_relative_store_is_opened_by_its_absolute_path(tmp_path, monkeypatch, capsys):
    """The server runs in the store's folder (relative artifact locations resolve there), so a
    relative ``sqlite:///runs/mlflow.db`` handed on as it is would open ``runs/runs/mlflow.db``."""
    monkeypatch.chdir(tmp_path)
    for command in (["ui"], ["server"]):
        option = "--tracking-uri" if command == ["ui"] else "--backend-store-uri"
        assert main([*command, "--dry-run", option, "sqlite:///runs/mlflow.db?timeout=5"]) == 0
        out = capsys.readouterr().out
        assert f"--backend-store-uri sqlite:///{tmp_path / 'runs' / 'mlflow.db'}?timeout=5 " in out


def test_server_serves_artifacts_on_the_chosen_host(capsys):
    code = main(["server", "--host", "0.0.0.0", "--backend-store-uri", "sqlite:////x/mlflow.db", "--dry-run"])
    assert code == 0
    command = capsys.readouterr().out
    assert "--host 0.0.0.0 --port 5000 --workers 1" in command
    assert "--serve-artifacts --artifacts-destination file:///x/mlruns" in command


def test_server_store_defaults_to_a_local_store_never_to_a_server(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.5:5000")
    assert ui.local_store_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////data/mlflow.db")
    assert ui.local_store_uri() == "sqlite:////data/mlflow.db"


def test_clients_get_this_nodes_address_for_a_wildcard_bind(monkeypatch):
    monkeypatch.setattr(ui, "node_address", lambda: "10.1.2.3")
    assert ui.client_url("0.0.0.0", 5000) == "http://10.1.2.3:5000"
    assert ui.client_url("192.168.0.7", 5001) == "http://192.168.0.7:5001"
    assert ui.client_url("::1", 5000) == "http://[::1]:5000"
    assert ui.local_address("0.0.0.0") == "127.0.0.1" and ui.local_address("::") == "[::1]"


def test_ui_without_a_store_says_where_it_looked(tmp_path, capsys):
    assert main(["ui", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 2
    err = capsys.readouterr().err
    assert f"no MLflow store at {tmp_path / 'mlflow.db'}" in err and "raysim run" in err


def test_ui_on_a_taken_port_names_the_port(tmp_path, capsys):
    (tmp_path / "mlflow.db").touch()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["ui", "--port", str(port), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 2
    assert f"port {port} on 127.0.0.1 is taken" in capsys.readouterr().err


def test_stopping_a_group_ends_every_process_in_it():
    group = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    time.sleep(0.3)  # both children started
    started = time.monotonic()
    ui.stop_process_group(group, grace_s=5)
    assert not group_alive(group.pid)
    assert time.monotonic() - started < 2  # SIGTERM sufficed: no wait for the grace period


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace_period():
    script = "trap '' TERM; sleep 60 & echo ready; wait"  # the child sleep inherits the ignored SIGTERM
    group = subprocess.Popen(["sh", "-c", script], start_new_session=True, stdout=subprocess.PIPE)
    assert group.stdout.readline() == b"ready\n"  # the trap is set: no sleep that may be too short
    group.stdout.close()
    started = time.monotonic()
    ui.stop_process_group(group, grace_s=0.5)
    assert not group_alive(group.pid)
    assert 0.5 <= time.monotonic() - started < 3


def test_ui_on_a_tracking_server_points_at_its_own_ui(capsys):
    uri = "http://127.0.0.1:1"  # nothing answers there: the command starts nothing and says so
    assert main(["ui", "--tracking-uri", uri]) == 0
    assert f"open {uri}" in capsys.readouterr().out


def test_the_port_ui_serves_a_store_on_is_the_port_later_run_links_name(tmp_path, monkeypatch, capsys):
    """Run links said port 5000 whatever port ``raysim ui --port`` was given."""
    from raysim.tracking.links import DEFAULT_UI, ui_base

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "mlflow.db").touch()
    assert ui_base(uri) == DEFAULT_UI  # never served: the default port
    monkeypatch.setattr(ui, "serve", lambda command, address, port, ready, store: ready(1.0, None) or 0)
    assert main(["ui", "--port", "5077", "--tracking-uri", uri]) == 0
    assert ui_base(uri) == "http://127.0.0.1:5077"
    assert ui_base(f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}") == DEFAULT_UI  # another store
