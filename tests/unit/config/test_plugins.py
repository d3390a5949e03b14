"""Plugin sections: a partial section keeps every other default of its plugin, at any depth."""

from raw_jobs import BASE, problems_of

from raysim.config import JobConfig, apply_overrides, flatten

# Options a plugin cannot do without, so that its Config validates at all.
REQUIRED_OPTIONS = {
    ("dataset", "hf_images"): {"path": "x"},
    ("dataset", "stackoverflow"): {"data_files": "x"},
    ("dataset", "glue"): {"task": "sst2"},
    ("dataset", "digit5"): {"root": "x"},
    ("dataset", "domainnet"): {"root": "x"},
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
    [far] = problems_of({**BASE, "algorithm": {"name": "fedadam", "server": {"qqqqq": 1}}})
    assert "algorithm.server.qqqqq: unknown key (valid keys: " in far  # before: "unknown key; (valid"


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
