"""`raysim run` on a job file with a sweep: --dry-run lists the cells and their count, starting
nothing; sweep-only flags on a file without a sweep, and --resume on a sweep, are one clear error."""

import yaml

from raysim.cli.main import main

JOB = {
    "name": "quick",
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
    "variants": [{"name": "fedavg"}, {"name": "fedprox", "algorithm": {"name": "fedprox"}}],
}


def write(tmp_path, **top):
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump({**JOB, **top}))
    return str(path)


def test_dry_run_lists_the_chosen_cells_and_their_count(tmp_path, capsys):
    path = write(tmp_path, sweep={"seeds": [0, 1], "grid": {"algorithm.local.lr": [0.01, 0.1]}})
    assert main(["run", path, "--dry-run", "--only", "variant=fedprox,seed=1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sweep quick-") and lines[0].endswith(": 2 cells of 8")
    assert [line.split()[0] for line in lines[1:3]] == ["fedprox_lr0.01_seed1", "fedprox_lr0.1_seed1"]
    assert lines[3].startswith("dry run: 2 cells (1 variant x 2 grid points x 1 seed; 2 of 8 chosen)")
    assert not (tmp_path / "mlflow.db").exists()


def test_sweep_flags_without_a_sweep_and_resume_with_one_are_refused(tmp_path, capsys):
    assert main(["run", write(tmp_path), "--only", "seed=1"]) == 2
    assert "has no sweep: section" in capsys.readouterr().err
    assert main(["run", write(tmp_path, sweep={"seeds": [0]}), "--resume", "x.pt"]) == 2
    assert "a sweep resumes by itself" in capsys.readouterr().err


def test_sigterm_ends_a_sweep_with_143_although_ray_made_it_exit_1(tmp_path, monkeypatch):
    """Ray's ray.wait runs the SIGTERM handler, catches its SystemExit(143) and raises
    SystemExit(1) (raysim.stop_request); the sweep command ends with the code the stop asked for."""
    import signal

    import pytest

    import raysim.cli.driver as driver
    import raysim.sweep.sweep_runs as sweep_runs
    from raysim.stop_request import clear_stop_request, note_stop_request

    def stopped_by_sigterm(*args, **kwargs):
        note_stop_request(143)
        raise SystemExit(1)

    monkeypatch.setattr(sweep_runs, "run_sweep", stopped_by_sigterm)
    monkeypatch.setattr(driver, "exit_on_sigterm", lambda: None)  # this process keeps its handler
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["run", write(tmp_path, sweep={"seeds": [0]})])
    finally:
        clear_stop_request()
    assert exit_info.value.code == 143 and signal.getsignal(signal.SIGTERM) is before


def test_dry_run_refuses_a_grid_value_name_mlflow_would_refuse(tmp_path, capsys):
    """What the run will send is checked: before, --dry-run passed and the run failed on MLflow's
    param key after the sweep's run began."""
    partitions = {"a/../evil": {"kind": "iid", "num_clients": 10}}
    assert main(["run", write(tmp_path, sweep={"grid": {"dataset.partition": partitions}}), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "MLflow would refuse the key 'sweep.grid.dataset.partition.a/../evil.kind'" in err
