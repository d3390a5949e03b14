"""A job file's sweep as its cells' jobs: values, seeds and names applied to each variant, and each
bad input (an axis a variant lacks, a bad value, too many cells, no cell chosen) one error."""

import pytest
import yaml

from raysim.config import load_jobs
from raysim.config.cells import describe, has_sweep, load_sweep
from raysim.errors import ConfigError

JOB = {
    "name": "quick",
    "seed": 9,
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg", "local": {"lr": 0.5}},
    "variants": [{"name": "fedavg"}, {"name": "fedprox", "algorithm": {"name": "fedprox", "mu": 0.01}}],
}


def job_file(tmp_path, sweep, **top):
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump({**JOB, **top, "sweep": sweep}))
    return path


def problems_of(path, **options):
    with pytest.raises(ConfigError) as info:
        load_sweep(path, **options)
    return info.value.problems


def test_each_cell_is_its_variant_with_the_cells_values_seed_and_name(tmp_path):
    path = job_file(tmp_path, {"seeds": [0, 1], "grid": {"algorithm.local.lr": [0.01, 0.1]}})
    sweep = load_sweep(path, ["engine.num_rounds=2"])
    assert len(sweep.cells) == sweep.total == 8 and sweep.id.startswith("quick-")
    job = sweep.jobs["fedprox_lr0.1_seed1"]
    assert job.name == "fedprox_lr0.1_seed1" and job.seed == 1
    assert job.algorithm.name == "fedprox" and job.algorithm.config.mu == 0.01
    assert job.algorithm.config.local.lr == 0.1 and job.engine.num_rounds == 2
    assert job.tracking.run_name == "quick/fedprox lr=0.1 seed=1"
    assert job.origin is not None and job.origin.variant == "fedprox"
    assert describe(sweep)[0] == f"sweep {sweep.id}: 8 cells"
    assert has_sweep(path) and [j.name for j in load_jobs(path)] == ["fedavg", "fedprox"]  # the base jobs


def test_filters_choose_cells_and_the_id_stays(tmp_path):
    path = job_file(tmp_path, {"seeds": [0, 1], "grid": {"algorithm.local.lr": [0.01, 0.1]}})
    sweep = load_sweep(path, only=["variant=fedavg,seed=1"])
    assert [c.name for c in sweep.cells] == ["fedavg_lr0.01_seed1", "fedavg_lr0.1_seed1"]
    assert sweep.total == 8 and sweep.id == load_sweep(path).id
    assert [c.name for c in load_sweep(path, variants=["fedprox"], only=["seed=0"]).cells] == [
        "fedprox_lr0.01_seed0",
        "fedprox_lr0.1_seed0",
    ]


def test_an_unknown_axis_key_names_the_nearest(tmp_path):
    problems = problems_of(job_file(tmp_path, {"grid": {"algorithm.local.rl": [0.1]}}))
    assert problems == [
        "sweep.grid.algorithm.local.rl: not a key of any variant; did you mean 'algorithm.local.lr'?"
    ]


def test_an_axis_one_variant_lacks_names_that_variant(tmp_path):
    problems = problems_of(
        job_file(tmp_path, {"random": {"samples": 2, "axes": {"algorithm.mu": {"choice": [0.1]}}}})
    )
    assert len(problems) == 1 and problems[0].startswith(
        "sweep.random.axes.algorithm.mu: not a key of variant 'fedavg'"
    )


def test_a_bad_value_is_reported_for_each_cell_before_anything_runs(tmp_path):
    problems = problems_of(job_file(tmp_path, {"grid": {"algorithm.local.lr": [0.1, -1.0]}}))
    assert len(problems) == 2
    assert problems[0].startswith("cell fedavg_lr-1_seed9: ") and "algorithm.local.lr" in problems[0]


def test_more_cells_than_the_limit_need_the_confirming_flag(tmp_path):
    path = job_file(tmp_path, {"seeds": [0, 1, 2], "max_cells": 5})
    problems = problems_of(path)
    assert problems == [
        "sweep: 6 cells exceed sweep.max_cells (5); raise sweep.max_cells, narrow it with --only, "
        "or pass --confirm-cells"
    ]
    assert len(load_sweep(path, confirm=True).cells) == 6
    assert len(load_sweep(path, only=["variant=fedavg"]).cells) == 3  # the chosen cells count


def test_no_cell_passing_the_filters_is_an_error(tmp_path):
    problems = problems_of(job_file(tmp_path, {"seeds": [0]}), only=["seed=4"])
    assert problems == ["sweep: no cell passes --variant [] --only ['seed=4']"]


def test_a_stopping_metric_the_job_does_not_log_is_one_error_naming_the_nearest(tmp_path):
    stopping = {"metric": "eval/centrl/accuracy", "mode": "max"}
    problems = problems_of(job_file(tmp_path, {"stopping": stopping}))
    assert problems == [
        "sweep.stopping.metric: 'eval/centrl/accuracy' is not an evaluation metric this job logs; "
        "did you mean 'eval/central/accuracy'? (variant 'fedavg')"
    ]
    stopping["metric"] = "eval/central/accuracy"
    assert len(load_sweep(job_file(tmp_path, {"stopping": stopping})).cells) == 2


def test_a_stopping_metric_of_a_scope_the_job_leaves_off_names_its_switch(tmp_path):
    stopping = {"metric": "eval/validation/accuracy", "mode": "max"}
    problems = problems_of(job_file(tmp_path, {"stopping": stopping}))
    assert len(problems) == 1 and problems[0].startswith(
        "sweep.stopping.metric: 'eval/validation/accuracy' is not an evaluation metric this job "
        "logs (eval/validation/... needs dataset.validation_fraction > 0)"
    )
    on = load_sweep(job_file(tmp_path, {"stopping": stopping}), ["dataset.validation_fraction=0.2"])
    assert len(on.cells) == 2


def test_a_grid_value_named_as_a_path_is_refused_before_anything_runs(tmp_path):
    """A named value's name is part of the sweep run's param keys (``sweep.grid.<axis>.<name>.*``).
    MLflow reads keys as paths and refuses ``a/../evil``; the run used to fail on it after its
    sweep run began (left RUNNING, no cell run), while --dry-run passed."""
    partitions = {"a/../evil": {"kind": "iid", "num_clients": 10}, "ok": {"kind": "iid", "num_clients": 20}}
    problems = problems_of(job_file(tmp_path, {"grid": {"dataset.partition": partitions}}))
    assert problems[0] == (
        "sweep: MLflow would refuse the key 'sweep.grid.dataset.partition.a/../evil.kind' of the sweep "
        "run's params (MLflow reads keys as paths, and this one resolves to 'evil.kind'); rename the "
        "grid value or key it comes from"
    )
    assert len(problems) == 2 and "a/../evil.num_clients" in problems[1]
    partitions["a-evil"] = partitions.pop("a/../evil")
    assert len(load_sweep(job_file(tmp_path, {"grid": {"dataset.partition": partitions}})).cells) == 4


def test_a_job_name_that_is_no_folder_name_is_refused_for_a_sweep_of_variants(tmp_path):
    """The sweep's id (the file's name and a hash) names its ledger and lock under
    <output dir>/sweeps/; each variant's name was checked, the file's own was not."""
    problems = problems_of(job_file(tmp_path, {"seeds": [0]}, name="../up"))
    assert len(problems) == 1 and problems[0].startswith("name '../up': names the run folder, so it must be")


def test_sweep_overrides_shrink_the_sweep_and_name_another_one(tmp_path):
    """Before, ``sweep.seeds=[0]`` reached each variant's job: "sweep: unknown key"."""
    path = job_file(tmp_path, {"seeds": [0, 1], "grid": {"algorithm.local.lr": [0.01, 0.1]}})
    # an axis key has dots: its grid is set whole
    sweep = load_sweep(path, ["sweep.seeds=[0]", "sweep.grid={algorithm.local.lr: [0.1]}"])
    assert [c.name for c in sweep.cells] == ["fedavg_lr0.1_seed0", "fedprox_lr0.1_seed0"]
    assert sweep.spec.seeds == [0] and sweep.id != load_sweep(path).id  # a smaller sweep, its own ledger
    assert problems_of(path, overrides=["fedavg:sweep.seeds=[0]"]) == [
        "override 'fedavg:sweep.seeds=[0]': the sweep crosses every variant; drop 'fedavg:'"
    ]


def test_a_sweep_override_of_a_file_without_a_sweep_says_so(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(JOB))
    with pytest.raises(ConfigError) as info:
        load_jobs(path, ["sweep.seeds=[0]"])
    assert info.value.problems == [
        "override 'sweep.seeds=[0]': the job file has no sweep: section to change; add one (docs/sweeps.md)"
    ]


def test_cells_logging_to_different_experiments_are_refused_when_the_sweep_loads(tmp_path):
    """Before, only the run refused them, after --dry-run had passed."""
    variants = [{"name": "fedavg"}, {"name": "other", "tracking": {"experiment": "elsewhere"}}]
    [problem] = problems_of(job_file(tmp_path, {"seeds": [0]}, variants=variants))
    assert problem.startswith("sweep: the cells log to different MLflow stores or experiments")


@pytest.mark.parametrize(
    "key", ["resources.backend", "resources.num_workers", "tracking.experiment", "tracking"]
)
def test_an_axis_that_cannot_change_the_model_is_refused_naming_it(tmp_path, key):
    """A grid over resources.backend ran cells that trained the same model (issue 29, item 8)."""
    values = {"resources.backend": ["ray", "serial"], "resources.num_workers": [1, 2]}.get(key, ["a", "b"])
    if key == "tracking":
        values = {"on": {"enabled": True}, "off": {"enabled": False}}
    [problem] = problems_of(job_file(tmp_path, {"grid": {key: values}}))
    assert problem.startswith(f"sweep.grid.{key}: says where the cells run or what they record, not what")
    [problem] = problems_of(job_file(tmp_path, {"random": {"samples": 2, "axes": {key: {"choice": [1, 2]}}}}))
    assert problem.startswith(f"sweep.random.axes.{key}: says where the cells run")


@pytest.mark.parametrize(
    "key, values", [("resources.precision", ["fp32", "bf16"]), ("resources.deterministic", [True, False])]
)
def test_an_axis_over_the_arithmetic_is_a_sweep(tmp_path, key, values):
    assert len(load_sweep(job_file(tmp_path, {"grid": {key: values}})).cells) == 4
