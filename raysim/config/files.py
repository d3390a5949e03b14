"""Job files: YAML read, variants merged over the base, ``key=value`` overrides applied, every
variant validated (one error listing every problem of every variant)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from raysim.config.job import JobConfig, JobOrigin, validate_job
from raysim.config.overrides import (
    DuplicateKey,
    JobLoader,
    check_targets,
    drop_unset,
    overrides_for,
    split_sweep,
)
from raysim.errors import ConfigError


def load_jobs(
    path: str | Path, overrides: list[str] | None = None, only: list[str] | None = None
) -> list[JobConfig]:
    """Loads a job file: one JobConfig, or one per variant (optionally only those named).
    ``VARIANT:key=value`` overrides apply to that variant only; ``key: !unset`` drops a key."""
    raw = read_job_file(Path(path))
    sweep, overrides = split_sweep(overrides or [], str(path))
    if raw.pop("sweep", None) is None and sweep:  # its cells are the variants' jobs (config.cells)
        problem = f"override {sweep[0]!r}: the job file has no sweep: section to change; add one"
        raise ConfigError([problem + " (docs/sweeps.md)"], str(path))
    variants = raw.pop("variants", None) or [None]
    if not isinstance(variants, list):
        raise ConfigError(["variants: must be a list of mappings"], str(path))
    jobs: list[JobConfig] = []
    problems_by_variant: dict[str, list[str]] = {}
    merged_all = [_with_variant(raw, variant, index, str(path)) for index, variant in enumerate(variants)]
    names = [merged.get("name") for merged in merged_all]
    _refuse_duplicate_names(names, str(path))
    check_targets(overrides, [str(n) for n in names] if variants != [None] else [], str(path))
    for variant, merged in zip(variants, merged_all, strict=True):
        if only and merged.get("name") not in only:
            continue
        try:
            own = overrides_for(overrides, str(merged.get("name")) if variant is not None else None)
            job = validate_job(drop_unset(apply_overrides(merged, own)), str(path))
            origin = _origin(Path(path), raw, job, variant, own)
            jobs.append(job.model_copy(update={"origin": origin}))
        except ConfigError as exc:
            label = f"variant {merged.get('name')!r}: " if variant is not None else ""
            problems_by_variant[label] = exc.problems
    problems = _merge_variant_problems(problems_by_variant, checked=len(jobs) + len(problems_by_variant))
    if problems:
        raise ConfigError(problems + _one_variant_hint(overrides, problems, jobs), str(path))
    if only and not jobs:
        raise ConfigError([f"variants: none named {', '.join(only)}"], str(path))
    return jobs


def job(
    source: dict[str, Any] | str | Path, overrides: list[str] | None = None, *, variant: str | None = None
) -> JobConfig:
    """One job from a mapping (a notebook's dict, shaped like a job file) or a job file, with
    ``key=value`` overrides: ``raysim.job({...})``, ``raysim.job("jobs/quickstart.yaml",
    ["seed=1"], variant="fedprox")``. A file with variants needs ``variant`` (``load_jobs``
    gives them all).

    Raises:
        ConfigError: every problem of the job, or a file with several variants and none named.
    """
    if isinstance(source, dict):
        if variant is not None:
            raise ConfigError(["variant: a mapping is one job; pass variant= with a job file"])
        return validate_job(drop_unset(apply_overrides(source, overrides or [])))
    jobs = load_jobs(source, overrides, [variant] if variant is not None else None)
    if len(jobs) > 1:
        names = ", ".join(j.name for j in jobs)
        raise ConfigError(
            [f"variants: the file has {len(jobs)} ({names}); pick one with variant="], str(source)
        )
    return jobs[0]


def _one_variant_hint(overrides: list[str], problems: list[str], accepted: list[JobConfig]) -> list[str]:
    """Where an override every variant got fails on some only, how to aim it at the others."""
    if not accepted:
        return []
    keys = {o: o.partition("=")[0] for o in overrides}
    failing = [o for o, key in keys.items() if ":" not in key and f": {key}:" in str(problems)]
    names = ", ".join(job.name for job in accepted)
    return [f"override {o!r} fits variants {names} only: write {accepted[0].name}:{o}" for o in failing]


def _refuse_duplicate_names(names: list[Any], source: str) -> None:
    """Each variant names its own run (``job/variant``) and folder: two of one name would log two
    runs that cannot be told apart."""
    repeated = sorted({str(name) for name in names if names.count(name) > 1})
    if repeated:
        fix = "give each variant its own name"
        raise ConfigError([f"variants: more than one is named {name!r}; {fix}" for name in repeated], source)


def _origin(path: Path, raw: dict, job: JobConfig, variant: Any, overrides: list[str]) -> JobOrigin:
    base_name = raw.get("name")
    return JobOrigin(
        path=str(path.absolute()),
        job=str(base_name) if base_name else path.stem,
        variant=job.name if variant is not None else None,
        overrides=tuple(overrides),
    )


def _merge_variant_problems(problems_by_variant: dict[str, list[str]], checked: int) -> list[str]:
    """Each problem once: one every checked variant shares (a typo in a base section) unprefixed,
    the others prefixed with their variant, so three variants do not print the same line thrice."""
    lists = list(problems_by_variant.values())
    shared = (
        [p for p in lists[0] if all(p in other for other in lists[1:])]
        if checked > 1 and len(lists) == checked
        else []
    )
    own = [label + p for label, found in problems_by_variant.items() for p in found if p not in shared]
    return list(dict.fromkeys([*shared, *own]))


def read_job_file(path: Path) -> dict[str, Any]:
    """A job file's mapping, as written."""
    try:
        raw = yaml.load(path.read_text(), Loader=JobLoader)  # noqa: S506 (safe, plus !unset)
    except FileNotFoundError:
        raise ConfigError([f"no such job file: {path}"]) from None
    except IsADirectoryError:
        raise ConfigError([f"{path} is a folder; name a job file in it (a .yaml)"]) from None
    except OSError as exc:
        raise ConfigError([f"cannot read the job file: {exc.strerror}"], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"not UTF-8 text (byte {exc.start}): a job file is YAML"], str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"], str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError(["a job file must hold a mapping of sections"], str(path))
    return raw


def _with_variant(base: dict, variant: Any, index: int, source: str) -> dict:
    if variant is None:
        return copy.deepcopy(base)
    if not isinstance(variant, dict):
        raise ConfigError([f"variants[{index}]: must be a mapping"], source)
    variant = dict(variant)
    name = variant.pop("name", None)
    merged = deep_merge(base, variant)
    algorithm = merged.get("algorithm", {})
    merged["name"] = (
        name
        or (algorithm.get("name") if isinstance(algorithm, dict) else None)
        or f"{base.get('name', 'job')}-{index}"
    )
    return merged


def deep_merge(base: dict, update: dict) -> dict:
    """A copy of ``base`` with ``update`` merged in, recursively for nested mappings."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Applies ``a.b.c=value`` overrides; values are parsed as YAML (``0.1``, ``[1, 2]``, ``null``,
    ``!unset``: drop the key)."""
    out = copy.deepcopy(raw)
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(f"override {item!r}: expected key.sub=value")
            continue
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        try:
            node[leaf] = yaml.load(text, Loader=JobLoader)  # noqa: S506 (safe, plus !unset)
        except DuplicateKey as exc:  # {lr: 1, lr: 2}: not a string to pass on as the value
            problems.append(f"override {item!r}: {exc}")
        except yaml.YAMLError:
            node[leaf] = text
    if problems:
        raise ConfigError(problems)
    return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (for MLflow params)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
