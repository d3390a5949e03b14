"""Job configs: every problem reported at once, with dotted keys, suggestions and choices."""

import typing

import pytest
import yaml
from raw_jobs import BASE, REPO, problems_of

from raysim.config import JobConfig, deep_merge, flatten, probes_never_due
from raysim.errors import ConfigError


def test_unknown_key_suggests_the_nearest_valid_one():
    [problem] = problems_of({**BASE, "engine": {"num_round": 3}})
    assert problem.startswith("engine.num_round: unknown key; did you mean 'num_rounds'?")


def test_unknown_key_inside_a_plugin_section():
    [problem] = problems_of({**BASE, "algorithm": {"name": "fedavg", "local": {"lrr": 0.1}}})
    assert "algorithm.local.lrr" in problem and "did you mean 'lr'" in problem


def test_an_infinite_learning_rate_is_refused_as_nan_is():
    """lr=inf passed ``gt=0`` and trained every client to NaN; so did a server or schedule lr."""
    inf = float("inf")
    local = {"lr": inf, "weight_decay": inf, "lr_schedule": {"kind": "constant", "lr": inf}}
    problems = problems_of({**BASE, "algorithm": {"name": "fedadam", "local": local, "server": {"lr": inf}}})
    wrong = sorted(p.split(":")[0].removeprefix("algorithm.") for p in problems)
    assert wrong == ["local.lr", "local.lr_schedule.constant.lr", "local.weight_decay", "server.lr"], problems
    assert all("Input should be a finite number" in p for p in problems)


def test_placement_takes_rays_strategy_names_in_any_case():
    assert JobConfig.from_dict({**BASE, "resources": {"placement": "strict_spread"}}).resources.placement == (
        "STRICT_SPREAD"
    )
    [problem] = problems_of({**BASE, "resources": {"placement": "scatter"}})
    assert problem.startswith("resources.placement:") and "'SPREAD'" in problem and "'PACK'" in problem
    [problem] = problems_of({**BASE, "resources": {"ship_data": "sometimes"}})
    assert problem.startswith("resources.ship_data:") and "'auto'" in problem and "'never'" in problem


def test_bad_value_says_what_is_allowed():
    [problem] = problems_of({**BASE, "resources": {"backend": "spark"}})
    assert "resources.backend" in problem and "'ray'" in problem and "'serial'" in problem


def test_unknown_algorithm_lists_the_available_ones():
    [problem] = problems_of({**BASE, "algorithm": {"name": "fedavgg"}})
    assert "did you mean 'fedavg'" in problem and "scaffold" in problem and "fedprox" in problem


def test_all_problems_are_reported_together():
    raw = {**BASE, "model": {"name": "nope"}, "engine": {"cohort_size": 0}, "sed": 1}
    problems = problems_of(raw)
    assert len(problems) == 3
    assert any(p.startswith("sed: unknown key; did you mean 'seed'") for p in problems)
    assert any(p.startswith("engine.cohort_size") for p in problems)


def test_a_seed_beyond_what_torch_and_numpy_accept_is_refused_naming_the_key():
    """2**70 used to pass here and overflow in every worker's torch.manual_seed."""
    [problem] = problems_of({**BASE, "seed": 2**70})
    assert problem.startswith(f"seed: Input should be less than or equal to {2**63 - 1}")
    assert JobConfig.from_dict({**BASE, "seed": 2**63 - 1}).seed == 2**63 - 1


def test_negative_seed_and_unschedulable_gpu_share():
    problems = problems_of({**BASE, "seed": -1, "resources": {"gpus_per_worker": 1.5}})
    assert any(p.startswith("seed: Input should be greater than or equal to 0") for p in problems)
    share = "resources.gpus_per_worker: must be auto (measured) or a share of one GPU from 0 to 1"
    assert any(p.startswith(share) for p in problems)


def test_a_tagged_section_without_its_tag_lists_the_tags_of_its_union():
    from raysim.train.schedules import Schedule

    union = typing.get_args(Schedule)[0]  # Annotated[Exponential | ... , Field(discriminator)]
    kinds = ", ".join(member.model_fields["kind"].default for member in typing.get_args(union))
    local = {"lr_schedule": {"kind": "switch", "from_round": 2, "before": {"decay": 0.9}}}
    problems = problems_of({**BASE, "algorithm": {"name": "fedavg", "local": local}})
    assert f"algorithm.local.lr_schedule.switch.before: needs kind: one of {kinds}" in problems
    ima = {
        "name": "ima",
        "average_from": 1,
        "inner": {"name": "fedavg", "local": {"lr_schedule": {"decay": 0.9}}},
    }
    assert problems_of({**BASE, "algorithm": ima}) == [
        f"algorithm.inner.local.lr_schedule: needs kind: one of {kinds}"
    ]


def test_a_sections_own_check_does_not_dump_the_section():
    both = {"lr_decay": 0.9, "lr_schedule": {"kind": "constant"}}
    [problem] = problems_of({**BASE, "algorithm": {"name": "fedavg", "local": both}})
    assert problem.startswith("algorithm.local: set lr_decay or lr_schedule, not both")
    assert "got" not in problem and "epochs" not in problem
    [value] = problems_of({**BASE, "algorithm": {"name": "fedavg", "local": {"lr": "x"}}})
    assert value.endswith("(got 'x')")  # a plain value is still quoted


def test_missing_section_is_named():
    problems = problems_of({"dataset": BASE["dataset"], "model": BASE["model"]})
    assert problems == [problems[0]] and problems[0].startswith("algorithm: required section missing")


def test_round_trip_through_to_dict():
    job = JobConfig.from_dict({**BASE, "algorithm": {"name": "fedprox", "mu": 0.5}})
    again = JobConfig.from_dict(job.to_dict())
    assert again == job and again.algorithm.config.mu == 0.5
    flat = flatten(job.to_dict())
    assert flat["algorithm.mu"] == 0.5 and flat["algorithm.local.lr"] == 0.05


def test_a_plugin_option_called_name_is_refused_at_registration():
    from pydantic import BaseModel

    from raysim import registry

    class Shadowing(BaseModel):
        name: str = "en"

    with pytest.raises(TypeError, match="may not have a field called 'name'"):
        registry.register("dataset", "shadowing", config=Shadowing)(object)


def test_a_dataset_config_must_be_a_dataset_config():
    """Stores are partitioned and cached from DatasetConfig's fields, so a recipe's Config is one."""
    from pydantic import BaseModel

    from raysim import registry

    class Plain(BaseModel):
        num_clients: int = 10

    with pytest.raises(TypeError, match="must subclass raysim.data.store.DatasetConfig"):
        registry.register("dataset", "plain_config_test", config=Plain)(object)


def test_a_benchmark_needs_a_plugin_with_local_training(tmp_path, monkeypatch):
    """The plain loop repeats the plugin's local SGD: a plugin without it is refused on load."""
    from pydantic import BaseModel

    from raysim import registry
    from raysim.bench.bench_file import load_benchmark

    class NoLocal(BaseModel, frozen=True, extra="forbid"):
        stages: int = 2

    entry = registry.Entry("algorithm", "no_local_test", object, NoLocal, "")
    monkeypatch.setitem(registry._entries["algorithm"], "no_local_test", entry)
    raw = yaml.safe_load((REPO / "jobs" / "bench" / "pfl_cifar10.yaml").read_text())
    raw["algorithm"] = {"name": "no_local_test"}
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="'no_local_test' has no local section"):
        load_benchmark(tmp_path / "bench.yaml", [])


UNSAFE_NAMES = ["../../../escaped_job", "a/b", "a\\b", "..", ".hidden", "", "two words", "x" * 201]


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_a_name_that_is_not_one_plain_folder_name_is_refused(name):
    [problem] = problems_of({**BASE, "name": name})
    assert problem.startswith("name: names the run folder") and "rename it" in problem


def test_plain_names_with_dots_and_dashes_pass():
    assert JobConfig.from_dict({**BASE, "name": "ima-cifar10_v1.2"}).name == "ima-cifar10_v1.2"


def test_a_probe_due_after_the_last_round_is_named_with_its_numbers():
    probes = [{"name": "client_server_barrier", "every": 5}, {"name": "local_accuracy", "every": 8}]
    job = JobConfig.from_dict({**BASE, "engine": {"num_rounds": 5}, "evaluation": {"probes": probes}})
    assert probes_never_due(job) == [
        "evaluation.probes[1].every: local_accuracy measures every 8 rounds, but the run has 5, so it "
        "never runs; set every to at most 5"
    ]  # every 5 of 5 rounds: due after round 4, the last


def test_the_noise_salt_differs_between_jobs_and_not_between_a_run_and_its_resume():
    from raysim.config.job import noise_salt

    def salt(**sections) -> int:
        base = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
        return noise_salt(JobConfig.from_dict(deep_merge(base, sections)))

    plain = salt()
    how = salt(name="other", engine={"num_rounds": 99, "vectorize": "on"}, resources={"num_workers": 3})
    assert how == plain  # a resume, another worker count or batching: the same noise
    assert salt(algorithm={"name": "fedavg", "local": {"lr": 0.02}}) != plain  # another job: other noise
    assert salt(seed=1) != plain and salt(engine={"cohort_size": 5}) != plain


def test_a_seed_of_true_is_no_seed():
    base = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
    with pytest.raises(ConfigError, match="seed: Input should be a valid integer"):
        JobConfig.from_dict({**base, "seed": True})
    assert JobConfig.from_dict({**base, "seed": 7}).seed == 7


def test_an_unknown_top_level_key_lists_every_section_of_a_job_file():
    """Before, the list held only the job's own sections: no dataset, model or algorithm."""
    [problem] = problems_of({**BASE, "modle": {"name": "mlp"}})
    valid = problem.split("valid keys: ")[1].rstrip(")").split(", ")
    assert problem.startswith("modle: unknown key; did you mean 'model'?")
    assert {"dataset", "model", "algorithm", "model_groups", "variants", "sweep", "engine"} <= set(valid)
    [far] = problems_of({**BASE, "qqqqq": 1})  # before: "unknown key; (valid keys: ...)"
    assert far.startswith("qqqqq: unknown key (valid keys: ")
    [problem] = problems_of({**BASE, "sweep": {"seeds": [0]}})  # in a variant: the file's, not the job's
    assert problem == "sweep: a job file's own section; set it at the file's top level, not in a variant"


def test_a_note_is_kept_but_changes_neither_the_noise_nor_the_resumable_config():
    from raysim.config.job import RESUMABLE_CHANGES, noise_salt

    plain, noted = JobConfig.from_dict(BASE), JobConfig.from_dict({**BASE, "note": "scores 0.18: see docs"})
    assert noted.note == "scores 0.18: see docs" and noted.to_dict()["note"] == noted.note
    assert "note" not in plain.to_dict()  # a job without one reads as before
    assert noise_salt(plain) == noise_salt(noted)
    assert "note".startswith(RESUMABLE_CHANGES)


def test_model_validate_validates_a_mapping_as_from_dict_does():
    """pydantic's own validation cannot see the plugins' Configs: it asked for a ``config`` field."""
    job = JobConfig.model_validate(BASE)
    assert job == JobConfig.from_dict(BASE) and JobConfig.model_validate(job) is job
    with pytest.raises(ConfigError, match="unknown algorithm 'nope'"):
        JobConfig.model_validate({**BASE, "algorithm": {"name": "nope"}})


def test_a_boolean_where_a_number_goes_is_refused_not_read_as_one():
    """Pydantic reads true as 1: ``engine.num_rounds=yes`` ran one round, ``epochs: on`` one epoch."""
    algorithm = {"name": "fedavg", "local": {"epochs": True, "lr": True, "grad_clip": None}}
    problems = problems_of({**BASE, "engine": {"num_rounds": True}, "algorithm": algorithm})
    assert sorted(problems) == [
        "algorithm.local.epochs: a number, not true (YAML reads yes, no, on, off so)",
        "algorithm.local.lr: a number, not true (YAML reads yes, no, on, off so)",
        "engine.num_rounds: a number, not true (YAML reads yes, no, on, off so)",
    ]
    JobConfig.from_dict({**BASE, "tracking": {"progress": False}})  # a real boolean stays one
