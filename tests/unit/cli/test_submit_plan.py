"""`raysim submit` without a cluster: what it would submit (entrypoint, runtime_env, env_vars),
the checks that refuse a submission, and the command's flow with Ray's client faked."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

import pytest
import yaml

from raysim.cli import ray_jobs, submit
from raysim.cli.main import main
from raysim.config import JobConfig
from raysim.errors import ConfigError, RaysimError

JOB = {
    "name": "tiny",
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 4}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def args(**options) -> argparse.Namespace:
    defaults = {"config": "jobs/x.yaml", "overrides": [], "variant": None, "tracking_uri": None,
                "output_dir": ".raysim"}  # fmt: skip
    return argparse.Namespace(**(defaults | options))


def job(**tracking) -> JobConfig:
    return JobConfig.from_dict({**JOB, "tracking": tracking})


def test_defaults_land_runs_and_checkpoints_in_the_submitting_directory(tmp_path):
    """What `raysim run` would use in the user's directory, made absolute: the job itself runs in
    a copy of it inside Ray's session folder."""
    plan = submit.plan(args(), [job()], tmp_path, environ={})
    assert plan.entrypoint == "python -m raysim run jobs/x.yaml"
    assert plan.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db"
    assert plan.output_dir == tmp_path / ".raysim"
    assert plan.runtime_env["working_dir"] == str(tmp_path)
    assert plan.runtime_env["env_vars"] == {
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
        "RAYSIM_HOME": str(tmp_path / ".raysim"),
        "RAYSIM_SUBMITTED_GIT": "{}",  # a job built in Python has no repository
        "RAYSIM_SUBMISSION_ID": plan.submission_id,
    }
    assert plan.submission_id.startswith("raysubmit_")
    excluded = set(plan.runtime_env["excludes"])
    assert {".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"} <= excluded
    assert {"mlflow.db*", "mlruns", "mlartifacts", ".raysim", "*.pt"} <= excluded


def test_relative_paths_are_the_users_and_overrides_and_variants_reach_the_job(tmp_path):
    plan = submit.plan(
        args(tracking_uri="sqlite:///store/m.db", output_dir="out/../runs", overrides=["engine.num_rounds=2",
             "tracking.tags.note=a b"], variant=["fedavg", "prox"]),
        [job()], tmp_path, environ={"MLFLOW_TRACKING_URI": "http://ignored:5000"},
    )  # fmt: skip
    assert plan.tracking_uri == f"sqlite:///{tmp_path}/store/m.db"
    assert plan.runtime_env["env_vars"]["RAYSIM_HOME"] == str(tmp_path / "runs")
    assert shlex.split(plan.entrypoint) == [
        "python", "-m", "raysim", "run", "jobs/x.yaml", "engine.num_rounds=2", "tracking.tags.note=a b",
        "--variant", "fedavg", "--variant", "prox",
    ]  # fmt: skip


def test_a_job_naming_its_own_relative_store_is_overridden_with_the_absolute_one(tmp_path):
    """The job's tracking.tracking_uri beats MLFLOW_TRACKING_URI, so the variable alone would not do."""
    plan = submit.plan(args(), [job(tracking_uri="sqlite:///mine.db")], tmp_path, environ={})
    assert plan.tracking_uri == f"sqlite:///{tmp_path}/mine.db"
    assert shlex.split(plan.entrypoint)[-1] == f"tracking.tracking_uri=sqlite:///{tmp_path}/mine.db"


def test_the_store_is_the_flag_then_the_job_then_the_variable_then_the_default(tmp_path):
    env = {"MLFLOW_TRACKING_URI": "http://server:5000"}
    assert submit.tracking_uri_for([job(tracking_uri="http://job:1")], "http://flag:1", env, tmp_path) == (
        "http://flag:1"
    )
    assert submit.tracking_uri_for([job(tracking_uri="http://job:1")], None, env, tmp_path) == "http://job:1"
    assert submit.tracking_uri_for([job()], None, env, tmp_path) == "http://server:5000"
    assert submit.tracking_uri_for([job()], None, {}, tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"
    variants = [job(tracking_uri="sqlite:///a.db"), job(tracking_uri="sqlite:///b.db")]
    with pytest.raises(ConfigError, match="several stores.*--tracking-uri"):
        submit.tracking_uri_for(variants, None, {}, tmp_path)
    assert submit.tracking_uri_for(variants, "http://flag:1", {}, tmp_path) == "http://flag:1"


def test_tracking_uris_are_made_absolute_only_where_they_are_relative_paths():
    cwd = Path("/home/u/project")
    assert submit.absolute_tracking_uri("sqlite:///mlflow.db", cwd) == "sqlite:////home/u/project/mlflow.db"
    assert (
        submit.absolute_tracking_uri("sqlite:///../s/m.db?timeout=9", cwd)
        == "sqlite:////home/u/s/m.db?timeout=9"
    )
    assert submit.absolute_tracking_uri("sqlite:////data/m.db", cwd) == "sqlite:////data/m.db"
    assert submit.absolute_tracking_uri("mlruns", cwd) == "/home/u/project/mlruns"
    assert submit.absolute_tracking_uri("http://host:5000", cwd) == "http://host:5000"
    assert submit.is_local_store("sqlite:////x.db") and submit.is_local_store("/x/mlruns")
    assert not submit.is_local_store("http://host:5000") and not submit.is_local_store("databricks")


def test_the_job_gets_this_shells_cache_plugins_and_offline_settings_and_nothing_else(tmp_path):
    environ = {
        "RAYSIM_CACHE": "cache",
        "RAYSIM_PLUGIN_PATH": os.pathsep.join(["plugins", "/opt/shared/plugins", ""]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "AWS_SECRET_ACCESS_KEY": "never",
        "MLFLOW_TRACKING_URI": "sqlite:///elsewhere.db",
    }
    env = submit.job_env(environ, tmp_path, "sqlite:////runs.db", tmp_path / "out")
    assert env == {
        "MLFLOW_TRACKING_URI": "sqlite:////runs.db",
        "RAYSIM_HOME": str(tmp_path / "out"),
        "RAYSIM_CACHE": str(tmp_path / "cache"),
        # inside the upload: relative to the job's copy of it; outside: the same path on the cluster
        "RAYSIM_PLUGIN_PATH": os.pathsep.join(["plugins", "/opt/shared/plugins"]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def test_a_job_file_outside_the_uploaded_directory_is_refused(tmp_path):
    assert submit.job_path_in(str(tmp_path / "jobs" / "a.yaml"), tmp_path) == "jobs/a.yaml"
    with pytest.raises(RaysimError, match="outside the current directory.*project folder"):
        submit.job_path_in("../other/a.yaml", tmp_path)


def test_addresses_are_urls_and_this_machine_is_told_apart():
    assert submit.dashboard_url("127.0.0.1:8265/") == "http://127.0.0.1:8265"
    assert submit.dashboard_url("https://ray.example:443") == "https://ray.example:443"
    assert submit.is_local_address("http://127.0.0.1:8265") and submit.is_local_address("http://localhost:1")
    own = [a for a in submit._machine_addresses() if "." in a and not a.startswith("127.")]
    assert all(submit.is_local_address(f"http://{address}:8265") for address in own)
    assert not submit.is_local_address("http://198.51.100.7:8265")  # TEST-NET-2, never this machine


def test_a_remote_cluster_cannot_write_a_store_on_this_machine(capsys):
    remote = "http://198.51.100.7:8265"
    with pytest.raises(
        ConfigError, match=r"file on this machine.*raysim server --host 0\.0\.0\.0.*--tracking-uri"
    ):
        submit.check_store_for_cluster("sqlite:////x/mlflow.db", remote, local=False, explicit=False)
    submit.check_store_for_cluster("sqlite:////shared/mlflow.db", remote, local=False, explicit=True)
    assert "warning" in capsys.readouterr().err  # named explicitly: taken to be on shared storage
    submit.check_store_for_cluster("http://127.0.0.1:5000", remote, local=False, explicit=True)
    assert "loopback" in capsys.readouterr().err
    submit.check_store_for_cluster(
        "sqlite:////x/mlflow.db", "http://127.0.0.1:8265", local=True, explicit=False
    )
    submit.check_store_for_cluster("http://10.0.0.2:5000", remote, local=False, explicit=True)
    assert capsys.readouterr().err == ""


def test_a_failure_keeps_rays_reason_and_says_when_the_cluster_lacks_raysim():
    logs = "Job entrypoint command failed with exit code 1, last available logs:\nNo module named raysim"
    text = submit.failure(logs)
    assert text.startswith("Job entrypoint command failed with exit code 1\n")
    assert "start the head (`ray start --head`) from the environment where raysim is installed" in text
    assert submit.failure("Job was stopped") == "Job was stopped"


# --- the command, with Ray's client faked ------------------------------------------------------------------


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    """Runs `raysim submit` in ``tmp_path`` against a fake cluster; ``calls`` records what it got."""
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB))
    monkeypatch.chdir(tmp_path)
    for key in ("RAY_AUTH_MODE", "MLFLOW_TRACKING_URI", "RAYSIM_HOME"):
        monkeypatch.delenv(key, raising=False)
    calls: dict = {"outcome": ("SUCCEEDED", "")}
    monkeypatch.setattr(ray_jobs, "auth_token", lambda environ, home: "tok")
    monkeypatch.setattr(ray_jobs, "connect", lambda address, token: calls.setdefault("address", address))
    monkeypatch.setattr(submit, "check_upload_size", lambda root: None)

    def fake_submit(client, token, entrypoint, runtime_env, submission_id):
        calls.update(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id)
        print("(uploaded)")
        return "raysubmit_abc"

    def fake_follow(client, job_id):
        if calls["outcome"] is KeyboardInterrupt:
            raise KeyboardInterrupt
        print("job output")
        return calls["outcome"]

    monkeypatch.setattr(ray_jobs, "submit", fake_submit)
    monkeypatch.setattr(ray_jobs, "follow", fake_follow)
    return calls


def test_the_command_prints_the_job_id_then_follows_to_success(cluster, capsys, tmp_path):
    assert main(["submit", "job.yaml", "--address", "127.0.0.1:8265", "engine.num_rounds=2"]) == 0
    out = capsys.readouterr().out
    assert out.index("submitted Ray job raysubmit_abc to http://127.0.0.1:8265") < out.index("job output")
    assert "job raysubmit_abc SUCCEEDED" in out and f"sqlite:///{tmp_path}/mlflow.db" in out
    assert cluster["entrypoint"] == "python -m raysim run job.yaml engine.num_rounds=2"
    assert cluster["runtime_env"]["env_vars"]["RAYSIM_HOME"] == str(tmp_path / ".raysim")


def test_a_failed_job_exits_1_with_its_status_and_reason(cluster, capsys):
    cluster["outcome"] = ("FAILED", "Job entrypoint command failed with exit code 2, last available logs: x")
    assert main(["submit", "job.yaml", "--address", "http://127.0.0.1:8265"]) == 1
    assert (
        "job raysubmit_abc FAILED: Job entrypoint command failed with exit code 2\n"
        in capsys.readouterr().out
    )


def test_ctrl_c_stops_following_not_the_job_and_says_how_to_follow_or_stop_it(cluster, capsys):
    cluster["outcome"] = KeyboardInterrupt
    assert main(["submit", "job.yaml", "--address", "http://127.0.0.1:8265"]) == 130
    out = capsys.readouterr().out
    assert "keeps running" in out
    # Ray's CLI sends the token only under RAY_AUTH_MODE=token
    assert "RAY_AUTH_MODE=token ray job logs raysubmit_abc --address http://127.0.0.1:8265 --follow" in out
    assert "RAY_AUTH_MODE=token ray job stop raysubmit_abc --address http://127.0.0.1:8265" in out


def test_no_follow_returns_after_the_id(cluster, capsys):
    cluster["outcome"] = KeyboardInterrupt  # following would fail the test
    assert main(["submit", "job.yaml", "--address", "http://127.0.0.1:8265", "--no-follow"]) == 0
    assert "raysubmit_abc" in capsys.readouterr().out


def test_a_bad_config_fails_before_anything_is_submitted(cluster, capsys):
    assert main(["submit", "job.yaml", "--address", "http://127.0.0.1:8265", "engine.num_round=2"]) == 2
    assert "engine.num_round" in capsys.readouterr().err and "entrypoint" not in cluster


def test_a_sweeps_cell_filters_reach_the_job(tmp_path):
    options = args(only=["variant=fedavg,seed=1", "seed=2"], confirm_cells=True)
    plan = submit.plan(options, [job()], tmp_path, {})
    assert shlex.split(plan.entrypoint)[-5:] == [
        "--only", "variant=fedavg,seed=1", "--only", "seed=2", "--confirm-cells",
    ]  # fmt: skip


def test_the_job_carries_the_submitting_checkouts_git_state_and_its_submission_id(tmp_path):
    import json
    import subprocess

    from raysim.config import load_jobs

    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB))
    subprocess.run([*git, "add", "job.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "job"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    plan = submit.plan(args(config="job.yaml"), load_jobs(tmp_path / "job.yaml"), tmp_path, {}, "raysubmit_7")
    env = plan.runtime_env["env_vars"]
    git_tags = json.loads(env["RAYSIM_SUBMITTED_GIT"])
    assert (git_tags["mlflow.source.git.commit"], git_tags["git_dirty"]) == (head, "false")
    assert env["RAYSIM_SUBMISSION_ID"] == plan.submission_id == "raysubmit_7"


def test_the_submission_id_given_to_ray_is_the_one_the_runs_are_tagged_with(cluster, capsys):
    assert main(["submit", "job.yaml", "--address", "127.0.0.1:8265"]) == 0
    assert cluster["submission_id"] == cluster["runtime_env"]["env_vars"]["RAYSIM_SUBMISSION_ID"]
