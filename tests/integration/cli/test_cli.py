"""The raysim command: runs end to end, lists plugins, and turns user errors into one message."""

from pathlib import Path

import yaml

from raysim.cli.main import main

REPO = Path(__file__).resolve().parents[3]

GOOD = {
    "name": "cli",
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg"},
    "engine": {"num_rounds": 2, "cohort_size": 3},
    "evaluation": {"every": 1},
    "resources": {"backend": "serial"},
    "tracking": {"experiment": "cli", "progress": False},
    "variants": [{"name": "avg"}, {"name": "prox", "algorithm": {"name": "fedprox"}}],
}


def write(tmp_path, raw):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_run_prints_a_comparison_of_the_variants(tmp_path, tracking_uri, capsys):
    code = main(["run", write(tmp_path, GOOD), "--output-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    assert "avg" in out and "prox" in out and "fedprox" in out
    assert "raysim ui" in out and tracking_uri in out
    assert out.count("time per round (mean") == 2  # one line per variant: where its time went


def test_bad_config_is_one_message_without_traceback(tmp_path, capsys):
    raw = {**GOOD, "engine": {"num_round": 2}, "algorithm": {"name": "fedavgg"}}
    code = main(["run", write(tmp_path, raw), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "engine.num_round: unknown key; did you mean 'num_rounds'?" in err
    assert "unknown algorithm 'fedavgg'; did you mean 'fedavg'?" in err
    assert "Traceback" not in err


def test_an_output_dir_that_is_a_file_is_one_message_before_the_run_starts(tmp_path, tracking_uri, capsys):
    """It used to end in a NotADirectoryError traceback once data and MLflow run were set up."""
    (tmp_path / "out").write_text("")
    for output_dir in (tmp_path / "out", tmp_path / "out" / "sub"):
        code = main(["run", write(tmp_path, GOOD), "--variant", "avg", "--output-dir", str(output_dir)])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err
        assert f"the output folder {output_dir} (--output-dir)" in err and "a file; pass a folder" in err


def test_bad_override_and_missing_file(tmp_path, capsys):
    assert main(["run", write(tmp_path, GOOD), "engine.cohort_size=abc"]) == 2
    assert "engine.cohort_size" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "none.yaml")]) == 2
    assert "no such job file" in capsys.readouterr().err


def test_cohort_larger_than_population_is_a_clear_error(tmp_path, capsys):
    code = main(["run", write(tmp_path, GOOD), "engine.cohort_size=50", "--output-dir", str(tmp_path)])
    assert code == 2 and "cohort_size: must be in 1..10" in capsys.readouterr().err


def test_ls_lists_every_registered_kind(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    for name in (
        "fedavg",
        "fedadam",
        "fedyogi",
        "fedavgm",
        "fedprox",
        "scaffold",
        "mnist",
        "digits",
        "cnn_pfl",
        "client_server_barrier",
        "local_accuracy",
        "resnet18",
        "hf_causal_lm",
    ):
        assert name in out


def test_ls_shows_one_kind(capsys):
    assert main(["ls", "probes"]) == 0
    out = capsys.readouterr().out
    assert "client_server_barrier" in out and "fedavg" not in out


def test_ui_serves_the_same_store_on_localhost(tracking_uri, capsys):
    assert main(["ui", "--dry-run", "--port", "5055"]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert "--host 127.0.0.1" in out and "--port 5055" in out and tracking_uri in out


def test_overrides_may_follow_options(tmp_path, capsys):
    code = main(
        [
            "run",
            write(tmp_path, GOOD),
            "--variant",
            "avg",
            "engine.num_rounds=1",
            "tracking.enabled=false",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "avg" in out and "prox" not in out


def one_line_error(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_prepare_with_missing_files_is_one_message(tmp_path, capsys):
    pattern = str(tmp_path / "c4-train.*.json.gz")
    assert main(["prepare", "c4", f"data_files={pattern}"]) == 2
    assert f"no file matches data_files '{pattern}'" in one_line_error(capsys)
    missing = str(tmp_path / "c4.json")
    assert main(["prepare", "c4", f"data_files={missing}"]) == 2
    assert f"no file matches data_files '{missing}'" in one_line_error(capsys)
    (tmp_path / "empty.json").touch()
    assert main(["prepare", "c4", f"data_files={tmp_path / 'empty.json'}"]) == 2
    assert "the files hold no records" in one_line_error(capsys)


def test_prepare_c4_from_the_hub_offline_says_what_to_do(capsys):
    assert main(["prepare", "c4"]) == 2  # tests run with HF_HUB_OFFLINE=1
    err = one_line_error(capsys)
    assert "'allenai/c4' (en) split 'train': the HuggingFace hub cannot be reached" in err
    assert "HF_HUB_OFFLINE is set" in err and "give data_files" in err


def test_image_jobs_whose_data_cannot_be_fetched_offline_are_one_message(tmp_path, capsys):
    for job, dataset in (("emnist", "flwrlabs/femnist"), ("cifar100", "uoft-cs/cifar100")):
        raw = yaml.safe_load((REPO / "jobs" / "fedfish" / f"{job}.yaml").read_text())
        del raw["sweep"]  # one run of the paper's job, not its table's cells
        path = write(tmp_path, raw)
        assert main(["run", path, "--variant", "fedavg", "--output-dir", str(tmp_path)]) == 2
        err = one_line_error(capsys)
        assert f"cannot load '{dataset}' split 'train': the HuggingFace hub cannot be reached" in err
        assert "path: parquet or imagefolder" in err


def test_dry_run_prints_every_variant_resolved_and_starts_nothing(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ray_before = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    code = main(["run", write(tmp_path, GOOD), "--dry-run", "--show-config", "engine.num_rounds=7"])
    assert code == 0
    configs, _, summary = capsys.readouterr().out.partition("dry run: ")
    assert summary.startswith("2 variants x 7 rounds x cohort 3 = 42 client trainings")
    docs = list(yaml.safe_load_all(configs))
    assert [d["name"] for d in docs] == ["avg", "prox"]
    assert [d["algorithm"]["name"] for d in docs] == ["fedavg", "fedprox"]
    assert all(d["engine"]["num_rounds"] == 7 for d in docs)
    assert docs[1]["algorithm"]["mu"] is not None  # defaults are filled in
    # no mlflow.db, no run folder: at most the machine's calibration, when the data was prepared
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written in (["job.yaml"], [".raysim/calibration.json", "job.yaml"]), written
    assert ray_before or not ("ray" in sys.modules and sys.modules["ray"].is_initialized())


def test_dry_run_warns_of_a_probe_that_would_never_run(tmp_path, capsys):
    probes = ["evaluation.probes=[{name: client_server_barrier, every: 9}]", "engine.num_rounds=3"]
    assert main(["run", write(tmp_path, GOOD), "--dry-run", "--variant", "avg", *probes]) == 0
    err = capsys.readouterr().err
    assert "warning: variant avg: evaluation.probes[0].every: client_server_barrier measures every 9" in err


def test_dry_run_of_one_variant_and_of_a_bad_config(tmp_path, capsys):
    assert main(["run", write(tmp_path, GOOD), "--dry-run", "--show-config", "--variant", "prox"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("---\n# variant: prox\n") and "# variant: avg" not in out
    assert main(["run", write(tmp_path, GOOD), "--dry-run", "--variant", "prox"]) == 0
    assert capsys.readouterr().out.startswith("dry run: 1 variant x 2 rounds")  # the YAML only when asked
    assert main(["run", write(tmp_path, GOOD), "--dry-run", "engine.num_round=2"]) == 2
    assert "engine.num_round: unknown key" in capsys.readouterr().err


def test_dry_run_checks_the_checkpoint_a_resume_names_and_show_config_needs_it(tmp_path, capsys):
    """Each passed before: a dry run said "checks passed" for a checkpoint the run refuses, and
    --show-config without --dry-run started a real run, printing no config."""
    job = write(tmp_path, GOOD)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    resume = ["--dry-run", "--variant", "prox", "--resume"]
    assert main(["run", job, *resume, str(tmp_path / "garbage.pt")]) == 2
    assert "garbage.pt is not a torch file (or a truncated one)" in capsys.readouterr().err
    assert main(["run", job, *resume, str(tmp_path / "absent.pt")]) == 2
    assert "absent.pt is neither a checkpoint file nor a run folder" in capsys.readouterr().err
    assert main(["run", job, "--dry-run", "--resume", str(tmp_path / "garbage.pt")]) == 2
    assert "pick one with --variant NAME" in capsys.readouterr().err
    assert main(["run", job, "--show-config", "--variant", "prox", "--output-dir", str(tmp_path)]) == 2
    assert "add --dry-run" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
