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
    assert [line.split()[0] for line in lines[1:]] == ["fedprox_lr0.01_seed1", "fedprox_lr0.1_seed1"]
    assert not (tmp_path / "mlflow.db").exists()


def test_sweep_flags_without_a_sweep_and_resume_with_one_are_refused(tmp_path, capsys):
    assert main(["run", write(tmp_path), "--only", "seed=1"]) == 2
    assert "has no sweep: section" in capsys.readouterr().err
    assert main(["run", write(tmp_path, sweep={"seeds": [0]}), "--resume", "x.pt"]) == 2
    assert "a sweep resumes by itself" in capsys.readouterr().err
