"""Job files: overrides parsed as YAML, variants merged over the base, problems shared by variants
reported once, file errors, and every job file in the repository validating."""

import re

import pytest
import yaml
from raw_jobs import BASE, REPO

from raysim.config import JobConfig, apply_overrides, load_jobs
from raysim.config.cells import has_sweep, load_sweep
from raysim.config.sweep import parse_sweep
from raysim.errors import ConfigError


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
    (tmp_path / "binary.yaml").write_bytes(b"a\xff\xfe")  # each was a traceback
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 1\): a job file is YAML"):
        load_jobs(tmp_path / "binary.yaml")
    with pytest.raises(ConfigError, match=f"{tmp_path} is a folder; name a job file in it"):
        load_jobs(tmp_path)


def test_a_key_written_twice_is_refused_where_yaml_would_keep_the_last(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: j\nengine: {num_rounds: 2, cohort_size: 3}\nengine: {num_rounds: 3}\n")
    with pytest.raises(ConfigError, match=r"'engine' is written twice in one mapping \(line 3\); keep one"):
        load_jobs(path)  # the first engine: section, with its cohort_size, was dropped silently
    path.write_text("name: j\nalgorithm: {name: fedavg, local: {lr: 0.1, lr: 0.2}}\n")
    with pytest.raises(ConfigError, match="'lr' is written twice"):
        load_jobs(path)
    # merges, the deeper one first, and a key over a merged one: no key written twice
    anchors = "base: &b {lr: 0.1}\nx: {y: &f {<<: *b, lr: 0.5}}\n"
    path.write_text(anchors + "name: j\nalgorithm: {name: fedavg, local: {<<: *f}}\n")
    with pytest.raises(ConfigError, match="base: unknown key") as info:
        load_jobs(path)
    assert "written twice" not in str(info.value)
    with pytest.raises(ConfigError, match=r"override 'algorithm.local=\{lr: 1, lr: 2\}': 'lr' is written"):
        load_jobs(REPO / "jobs" / "quickstart.yaml", ["algorithm.local={lr: 1, lr: 2}"])


def test_every_job_file_in_the_repo_validates():
    from raysim.bench.bench_file import load_benchmark

    paths = sorted((REPO / "jobs").rglob("*.yaml"))
    assert len(paths) == 63  # a new job file must be added here on purpose
    for path in paths:
        if "bench" in path.relative_to(REPO / "jobs").parts:
            assert load_benchmark(path, [])[0].name, path  # a job plus a bench: section
        elif has_sweep(path):
            assert load_sweep(path, only=first_cells(path)).cells, path  # axes checked, one cell each
        else:
            assert load_jobs(path), path


def first_cells(path):
    """``--only`` for each variant's first cell: the first seed and the first value of each axis
    (its first name when the grid names its values), so a sweep of hundreds of cells checks a few."""
    spec = parse_sweep(yaml.safe_load(path.read_text())["sweep"])
    axes = [f"seed={spec.seeds[0]}"] if spec.seeds else []
    for key in spec.grid:
        name, value = spec.points(key)[0]
        axes.append(f"{key}={name if name is not None else value}")
    return [",".join(axes)] if axes else []


def test_two_variants_of_one_name_are_refused_naming_it(tmp_path):
    path = tmp_path / "job.yaml"
    # an unnamed variant is named by its algorithm, so it can collide too
    variants = [{"name": "a"}, {"name": "a", "seed": 1}, {"algorithm": {"name": "fedprox"}}]
    variants.append({"name": "fedprox"})
    path.write_text(yaml.safe_dump({**BASE, "variants": variants}))
    with pytest.raises(ConfigError) as info:
        load_jobs(path)
    assert info.value.problems == [
        "variants: more than one is named 'a'; give each variant its own name",
        "variants: more than one is named 'fedprox'; give each variant its own name",
    ]


def test_a_variant_named_as_a_path_is_refused_before_any_folder_is_made(tmp_path):
    """A variant's name names its run folder as a job's does (issue 16: ``../../../escaped_job``)."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**BASE, "variants": [{"name": "ok"}, {"name": "../../escaped"}]}))
    with pytest.raises(ConfigError, match="names the run folder") as info:
        load_jobs(path)
    assert "'../../escaped'" in str(info.value)
    assert [p.name for p in tmp_path.iterdir()] == ["job.yaml"]


def test_switching_a_partitions_kind_by_override_names_the_keys_to_drop_and_the_fix():
    raw = {**BASE, "dataset": {"name": "digits", "partition": {"kind": "dirichlet", "alpha": 0.3}}}
    with pytest.raises(ConfigError) as exc:
        JobConfig.from_dict(apply_overrides(raw, ["dataset.partition.kind=iid"]))
    assert exc.value.problems == [
        "dataset.partition.alpha: not a key of kind 'iid' (its keys: kind, num_clients); remove it, "
        "or to switch kind set the whole section: dataset.partition='{kind: iid}'"
    ]
    switched = JobConfig.from_dict(apply_overrides(raw, ["dataset.partition={kind: iid}"]))
    assert switched.dataset.config.partition.kind == "iid"


# "# cost: ~3 min on 2 CPU cores (measured 2026-12-06)", "~40 min est. on ... (1 round measured ...)",
# "not run on a laptop: ... (not measured)"
COST = re.compile(
    r"^# cost: (~[\d.]+ (s|min|h)( est\.)? on |not run on a laptop)"
    r".*\([^()]*measured[^()]*\)$"  # where the figure comes from
)


def test_every_job_file_says_its_cost_in_one_greppable_line():
    """``grep -r '^# cost:' jobs`` lists every job's cost: measured, extrapolated (est.) or not run."""
    missing = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "jobs").rglob("*.yaml"))
        if not any(COST.match(line) for line in path.read_text().splitlines()[:40])
    ]
    assert not missing, f"job files without a '# cost: ...' header line: {missing}"


def test_job_takes_a_mapping_or_a_file_and_one_of_its_variants(tmp_path):
    from raysim.config.files import job

    assert job(BASE, ["seed=4"]).seed == 4  # a notebook's dict, overrides as on the command line
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({**BASE, "variants": [{"name": "a"}, {"name": "b", "seed": 9}]}))
    assert job(path, variant="b").seed == 9
    with pytest.raises(ConfigError, match=r"variants: the file has 2 \(a, b\); pick one with variant="):
        job(path)
