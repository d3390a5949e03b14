"""Job configs: every problem reported at once, with dotted keys, suggestions and choices."""

import typing
from pathlib import Path

import pytest
import yaml

from raysim.config import JobConfig, apply_overrides, flatten, load_jobs
from raysim.config.renames import refuse_renamed, upgrade_saved_job
from raysim.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
BASE = {
    "dataset": {"name": "digits", "partition": {"kind": "iid", "num_clients": 10}},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
}


def problems_of(raw):
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict(raw)
    return info.value.problems


def test_unknown_key_suggests_the_nearest_valid_one():
    [problem] = problems_of({**BASE, "engine": {"num_round": 3}})
    assert problem.startswith("engine.num_round: unknown key; did you mean 'num_rounds'?")


def test_unknown_key_inside_a_plugin_section():
    [problem] = problems_of({**BASE, "algorithm": {"name": "fedavg", "local": {"lrr": 0.1}}})
    assert "algorithm.local.lrr" in problem and "did you mean 'lr'" in problem


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


def test_negative_seed_and_unschedulable_gpu_share():
    problems = problems_of({**BASE, "seed": -1, "resources": {"gpus_per_worker": 1.5}})
    assert any(p.startswith("seed: Input should be greater than or equal to 0") for p in problems)
    assert any(p.startswith("resources.gpus_per_worker: must be at most 1") for p in problems)


def test_a_tagged_section_without_its_tag_lists_the_tags_of_its_union():
    from raysim.train.schedules import Schedule

    union = typing.get_args(Schedule)[0]  # Annotated[Exponential | ... , Field(discriminator)]
    kinds = ", ".join(member.model_fields["kind"].default for member in typing.get_args(union))
    local = {"lr_schedule": {"kind": "switch", "start_round": 2, "before": {"decay": 0.9}}}
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


def test_overrides_parse_values_as_yaml():
    raw = apply_overrides(
        BASE,
        [
            "engine.num_rounds=7",
            "algorithm.local.lr=0.5",
            "tracking.enabled=false",
            "evaluation.clients=null",
        ],
    )
    job = JobConfig.from_dict(raw)
    assert job.engine.num_rounds == 7 and job.algorithm.config.local.lr == 0.5
    assert job.tracking.enabled is False and job.evaluation.clients is None
    with pytest.raises(ConfigError, match="expected key.sub=value"):
        apply_overrides(BASE, ["engine.num_rounds"])


def test_variants_merge_over_the_base_and_overrides_win(tmp_path):
    path = tmp_path / "job.yaml"
    variants = [{"name": "a"}, {"name": "b", "algorithm": {"name": "fedprox", "mu": 1.0}}]
    path.write_text(
        yaml.safe_dump({**BASE, "algorithm": {"name": "fedavg", "local": {"lr": 0.2}}, "variants": variants})
    )
    a, b = load_jobs(path, ["engine.num_rounds=2"])
    assert (a.name, a.algorithm.name, b.name, b.algorithm.name) == ("a", "fedavg", "b", "fedprox")
    assert b.algorithm.config.local.lr == 0.2 and b.engine.num_rounds == 2
    assert [j.name for j in load_jobs(path, only=["b"])] == ["b"]
    with pytest.raises(ConfigError, match="none named c"):
        load_jobs(path, only=["c"])


def test_a_problem_every_variant_shares_is_reported_once(tmp_path):
    path = tmp_path / "job.yaml"
    variants = [{"name": "a"}, {"name": "b", "algorithm": {"name": "fedprox"}}, {"name": "c"}]
    path.write_text(yaml.safe_dump({**BASE, "variants": variants}))
    with pytest.raises(ConfigError) as info:
        load_jobs(path, ["algorithm.local.lrr=0.1"])
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("algorithm.local.lrr: unknown key; did you mean 'lr'?")
    # a problem of some variants only keeps each one's name; the shared one still comes once
    with pytest.raises(ConfigError) as info:
        load_jobs(path, ["algorithm.mu=0.5", "engine.num_round=2"])
    assert info.value.problems[0].startswith("engine.num_round: unknown key")
    assert [p.split(":")[0] for p in info.value.problems[1:]] == ["variant 'a'", "variant 'c'"]
    # one variant picked with --variant: its problems are its own, prefixed
    with pytest.raises(ConfigError) as info:
        load_jobs(path, ["algorithm.local.lrr=0.1"], only=["b"])
    assert info.value.problems[0].startswith("variant 'b': algorithm.local.lrr")


def test_file_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such job file"):
        load_jobs(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_jobs(tmp_path / "bad.yaml")


def test_every_job_file_in_the_repo_validates():
    from raysim.cli.bench import load_benchmark

    paths = sorted((REPO / "jobs").rglob("*.yaml"))
    assert len(paths) == 33  # a new job file must be added here on purpose
    for path in paths:
        if "bench" in path.relative_to(REPO / "jobs").parts:
            assert load_benchmark(path, [])[0].name, path  # a job plus a bench: section
        else:
            assert load_jobs(path), path


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
    from raysim.cli.bench import load_benchmark

    class NoLocal(BaseModel, frozen=True, extra="forbid"):
        stages: int = 2

    entry = registry.Entry("algorithm", "no_local_test", object, NoLocal, "")
    monkeypatch.setitem(registry._entries["algorithm"], "no_local_test", entry)
    raw = yaml.safe_load((REPO / "jobs" / "bench" / "pfl_cifar10.yaml").read_text())
    raw["algorithm"] = {"name": "no_local_test"}
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="'no_local_test' has no local section"):
        load_benchmark(tmp_path / "bench.yaml", [])


# Options a plugin cannot do without, so that its Config validates at all.
REQUIRED_OPTIONS = {
    ("dataset", "hf_images"): {"path": "x"},
    ("dataset", "stackoverflow"): {"data_files": "x"},
    ("dataset", "glue"): {"task": "sst2"},
    ("algorithm", "ima"): {"inner": {"name": "fedavg"}, "average_from": 0},
}


def plugin_sections_with_own_defaults():
    """(kind, plugin, field, default) for each nested section whose plugin default is not the
    section class's own default (FedAdam's Adam server, FedFish's lr 1e-3 clients, ...)."""
    from pydantic import BaseModel, ValidationError

    from raysim import registry

    found = []
    for kind in registry.KINDS:
        for entry in registry.entries(kind):
            for field_name, field in entry.config.model_fields.items():
                default = None if field.is_required() else field.get_default(call_default_factory=True)
                if not isinstance(default, BaseModel):
                    continue
                try:
                    is_generic = type(default)() == default
                except ValidationError:  # the section class has required options of its own
                    is_generic = False
                if not is_generic:
                    found.append((kind, entry, field_name, default))
    return found


def test_a_partial_nested_section_keeps_every_other_plugin_default():
    from raysim.registry import plugin_config

    cases = plugin_sections_with_own_defaults()
    covered = {(entry.name, field_name) for _, entry, field_name, _ in cases}
    expected = {("fedadam", "server"), ("fedavgm", "server"), ("fedfish", "local"), ("c4", "partition")}
    assert expected <= covered
    for kind, entry, field_name, default in cases:
        base = REQUIRED_OPTIONS.get((kind, entry.name), {})
        for key, value in default.model_dump(mode="json").items():
            config = plugin_config(entry.config, {**base, field_name: {key: value}})
            assert getattr(config, field_name) == default, f"{kind} {entry.name}: {field_name}.{key}"


def test_the_reported_examples_keep_their_plugin_defaults():
    def algorithm(section, overrides):
        raw = apply_overrides({**BASE, "algorithm": section}, overrides)
        return JobConfig.from_dict(raw).algorithm.config

    adam = algorithm({"name": "fedadam"}, ["algorithm.server.lr=0.03"]).server
    assert (adam.kind, adam.lr, adam.beta2, adam.eps) == ("adam", 0.03, 0.99, 1e-3)
    assert algorithm({"name": "fedavgm", "server": {"lr": 0.5}}, []).server.momentum == 0.9
    fish = algorithm({"name": "fedfish", "local": {"epochs": 4}}, [])
    assert (fish.local.epochs, fish.local.lr, fish.server.kind) == (4, 1e-3, "adam")


def test_partial_sections_merge_at_any_depth():
    from pydantic import BaseModel

    from raysim.registry import plugin_config

    class Inner(BaseModel, frozen=True, extra="forbid"):
        a: int = 1
        b: int = 2

    class Middle(BaseModel, frozen=True, extra="forbid"):
        inner: Inner = Inner(a=10, b=20)
        c: int = 3

    class Outer(BaseModel, frozen=True, extra="forbid"):
        middle: Middle = Middle(inner=Inner(a=100, b=200), c=30)

    config = plugin_config(Outer, {"middle": {"inner": {"a": 5}}})
    assert config.middle == Middle(inner=Inner(a=5, b=200), c=30)
    problems = problems_of({**BASE, "algorithm": {"name": "fedadam", "server": {"lrr": 1}}})
    assert len(problems) == 1 and "algorithm.server.lrr: unknown key; did you mean 'lr'" in problems[0]


def test_another_member_of_a_tagged_union_starts_from_its_own_defaults():
    from raysim.data.partition import DomainPartition, IidPartition

    def partition(options):
        job = JobConfig.from_dict({**BASE, "dataset": {"name": "digits", "partition": options}})
        return job.dataset.config

    # digits defaults to iid over 100 clients: its num_clients must not leak into a domain split
    assert partition({"kind": "domain", "column": "group"}).partition == DomainPartition(column="group")
    assert partition({"num_clients": 7}).partition == IidPartition(num_clients=7)


def test_the_resolved_config_holds_the_merged_plugin_defaults():
    raw = apply_overrides({**BASE, "algorithm": {"name": "fedadam"}}, ["algorithm.server.lr=0.03"])
    job = JobConfig.from_dict(raw)
    flat = flatten(job.to_dict())  # what MLflow logs and the checkpoint saves
    assert (flat["algorithm.server.kind"], flat["algorithm.server.lr"]) == ("adam", 0.03)
    assert JobConfig.from_dict(job.to_dict()) == job


def test_a_partial_section_of_another_kind_starts_from_that_kinds_defaults():
    """FedFish's server is bias-corrected Adam; {kind: sgd, lr: 1} is plain SGD, not SGD that
    inherits Adam's bias_correction (which SGD refuses)."""
    raw = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}}
    job = JobConfig.from_dict(raw | {"algorithm": {"name": "fedfish", "server": {"kind": "sgd", "lr": 1.0}}})
    server = job.algorithm.config.server
    assert (server.kind, server.lr, server.bias_correction) == ("sgd", 1.0, False)
    adam = JobConfig.from_dict(
        raw | {"algorithm": {"name": "fedfish", "server": {"lr": 0.5}}}
    ).algorithm.config
    assert (adam.server.kind, adam.server.lr, adam.server.bias_correction) == ("adam", 0.5, True)


FEDAVG_V = {"name": "fedavg", "variant": "x"}
FEDGMA_IN_IMA = {"name": "ima", "average_from": 1, "inner": {"name": "fedgma", "variant": "ima_code"}}


@pytest.mark.parametrize(
    ("algorithm", "problem"),
    [
        ({"name": "fedgma", "variant": "ima_code"}, "variant: renamed to algorithm.reading: paper or"),
        ({"name": "fedgma", "tau": 0.8}, "tau: renamed to algorithm.agreement_threshold"),
        ({"name": "fedgucci_plus", "replicate_quirks": True}, "quirks: renamed to algorithm.reading"),
        ({"name": "fedlc", "logit_calibration": {"tau": 0.1}}, "tau: renamed to algorithm.logit_calib"),
        ({"name": "feddyn", "penalty": "norm"}, "penalty: renamed to algorithm.reading: paper (was"),
        ({"name": "local", "init": "client"}, "init: renamed to algorithm.start_from: shared_init"),
        ({"name": "ima", "start_round": 1, "inner": {"name": "fedavg"}}, "round: renamed to algorithm.aver"),
        (FEDGMA_IN_IMA, "algorithm.inner.variant: renamed to algorithm.inner.reading"),
        ({"name": "moon", "negative": "initial"}, "negative: value renamed: shared_init (was initial)"),
        ({"name": "fedadam", "server": {"initial_second_moment": "tau_squared"}}, "eps_squared (was tau_"),
    ],
)
def test_a_renamed_plugin_option_is_refused_once_naming_its_new_key(algorithm, problem):
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict({"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": algorithm})
    assert len(info.value.problems) == 1, info.value.problems  # not also an "unknown key"
    assert problem in info.value.problems[0] and info.value.problems[0].startswith("algorithm.")


def test_an_option_renamed_in_one_plugin_is_just_unknown_in_another():
    with pytest.raises(ConfigError) as info:  # fedavg never had ``variant``
        JobConfig.from_dict({"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": FEDAVG_V})
    assert len(info.value.problems) == 1 and "algorithm.variant: unknown key" in info.value.problems[0]


# Every old name, in a job as raysim wrote it before the renames (resolved: every option present).
SAVED_BEFORE_RENAMES = [
    ({"name": "fedgma", "variant": "ima_code", "tau": 0.5},
     {"reading": "ima_code", "agreement_threshold": 0.5}),
    ({"name": "fedgucci_plus", "replicate_quirks": True, "logit_calibration": {"tau": 0.1}},
     {"reading": "fedgucci_code", "logit_calibration": {"strength": 0.1}}),
    ({"name": "feddyn", "penalty": "norm"}, {"reading": "fedgucci_code"}),
    ({"name": "local", "init": "client"}, {"start_from": "client_init"}),
    ({"name": "moon", "negative": "initial"}, {"negative": "shared_init"}),
    ({"name": "fedadam", "server": {"kind": "adam", "initial_second_moment": "tau_squared"}},
     {"server": {"kind": "adam", "initial_second_moment": "eps_squared"}}),
    ({"name": "ima", "start_round": 2, "inner": {"name": "feddyn", "penalty": "squared"}},
     {"average_from": 2, "inner": {"name": "feddyn", "reading": "paper"}}),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), SAVED_BEFORE_RENAMES)
def test_a_job_saved_before_the_renames_is_upgraded_to_todays_names(old, new):
    """A checkpoint's or a logged run's job is raysim's own writing: it is read in today's names
    (resume then sees no change the user did not make), where a job file is refused."""
    job = {"name": "j", "dataset": {"name": "digits"}, "algorithm": old}
    upgraded = upgrade_saved_job(job)
    assert upgraded["algorithm"] == {"name": old["name"], **new}
    assert upgraded["dataset"] == job["dataset"] and job["algorithm"] == old  # the input is not changed
    assert upgrade_saved_job(upgraded) == upgraded  # today's names stay as they are
    problems: list[str] = []
    refuse_renamed(upgraded["algorithm"], "algorithm", problems)
    assert problems == []
