"""One simulation's config: the plugin sections, the job's own sections, and where it came from."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from typing import Any, Self

from pydantic import BaseModel, Field, ValidationError, field_validator

from raysim import registry
from raysim.config.compression import CompressionConfig, compression_problems
from raysim.config.model_groups import ModelGroups, check_mixed_models, validate_model_groups
from raysim.config.plugins import (
    PluginSection,
    default_model,
    explain,
    job_problems,
    validate_plugin,
    validate_probes,
)
from raysim.config.privacy import PrivacyConfig, sampling_problems
from raysim.config.renames import refuse_renamed
from raysim.config.robust import AttackConfig, RobustConfig, robust_problems
from raysim.config.sections import EngineConfig, EvaluationConfig, ResourcesConfig, TrackingConfig
from raysim.config.selection import selection_problems
from raysim.config.system import SystemConfig
from raysim.errors import ConfigError

PLUGIN_SECTIONS: tuple[registry.Kind, ...] = ("dataset", "model", "algorithm")


# Keys that moved to another section: the error says where they went.
MOVED_KEYS = {
    "engine.eval_every": "evaluation.every",
    "engine.eval_clients": "evaluation.clients",
    "engine.eval_batch_size": "evaluation.batch_size",
    "engine.heldout_fraction": "evaluation.heldout_fraction",
    "engine.heldout_eval_clients": "evaluation.heldout_clients",
    "engine.barrier_every": "evaluation.probes: [{name: client_server_barrier, every: K}]",
}

# Settings that change how or where a run goes, not what it computes: a continued run may differ
# in them (``engine.num_rounds`` is the point of resuming; workers may be fewer after a crash;
# ``note`` is words for the reader; a robust rule's device and memory, where the driver runs it).
RESUMABLE_CHANGES = (
    "engine.num_rounds",
    "tracking.",
    "resources.",
    "note",
    "robust.device",
    "robust.memory_mb",
)

# Of those, what never changes the trained model: where results are recorded, and where and on
# how many workers clients train. Not the arithmetic (a format, a device, deterministic kernels).
ARITHMETIC = ("resources.precision", "resources.gpus_per_worker", "resources.deterministic")


def changes_no_model(key: str) -> bool:
    """``key`` (dotted) says where a job runs or what it records, never what it trains: sweeping
    it would give cells that train the same model."""
    where = key == "tracking" or key.startswith(("tracking.", "resources."))
    return where and not key.startswith(ARITHMETIC)


# A job file's own top-level keys, beside a job's sections: variants merge over the rest, and a
# sweep's cells are the variants' jobs (raysim.config.files, raysim.config.cells).
FILE_KEYS = ("variants", "sweep")


# A job's name (a variant's, for a job file with variants) names its run folder under --output-dir:
# one plain path component, so no name can place the folder elsewhere ("../x", "a/b", ".hidden").
SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")


def check_folder_name(name: str) -> str:
    """``name`` itself when it can be a run folder's name; raises ValueError saying the fix."""
    if not SAFE_NAME.fullmatch(name):
        raise ValueError(
            "names the run folder, so it must be 1-200 letters, digits, '_', '-' or '.', not "
            "starting with '.' (no '/', '..' or spaces); rename it, e.g. "
            f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name).lstrip('._') or 'job'!r}"
        )
    return name


class JobOrigin(BaseModel, frozen=True, extra="forbid"):
    """The job file a config came from: ``raysim run`` names its MLflow run ``job/variant`` and
    tags it with the commit of the repository holding the file."""

    path: str  # the job file, absolute
    job: str  # the file's top-level ``name``, else its stem
    variant: str | None = None  # the variant's name; None for a file without variants
    overrides: tuple[str, ...] = ()  # the command line's overrides of this variant (prefix dropped)


class JobCore(BaseModel, frozen=True, extra="forbid"):
    """The job's own sections: everything but the plugin sections, which each plugin validates."""

    name: str = "job"
    # what a reader should know before running it (a surprising score, say): shown at the start
    # and by --dry-run; not part of what the run computes (RESUMABLE_CHANGES)
    note: str | None = None
    seed: int = Field(0, ge=0, le=2**63 - 1)  # the most torch.manual_seed and numpy accept alike
    engine: EngineConfig = EngineConfig()
    resources: ResourcesConfig = ResourcesConfig()
    tracking: TrackingConfig = TrackingConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    system: SystemConfig | None = None
    privacy: PrivacyConfig | None = None  # differential privacy (raysim.config.privacy)
    compression: CompressionConfig | None = None  # encoded updates (raysim.config.compression)
    robust: RobustConfig | None = None  # a Byzantine-robust rule (raysim.config.robust)
    attack: AttackConfig | None = None  # malicious clients (raysim.config.robust)

    @field_validator("name")
    @classmethod
    def _name_is_a_folder(cls, name: str) -> str:
        return check_folder_name(name)

    @field_validator("seed", mode="before")
    @classmethod
    def _no_boolean_seed(cls, seed: Any) -> Any:
        """YAML reads ``seed: true`` as a boolean, which pydantic would take as 1."""
        if isinstance(seed, bool):
            raise ValueError(f"Input should be a valid integer, not the boolean {seed}")
        return seed


class JobConfig(JobCore, frozen=True, extra="forbid"):
    """One simulation: data, model, algorithm, engine, resources, tracking; optionally the clients
    as devices on a simulated clock (``system``, ``raysim.systems``)."""

    dataset: PluginSection
    model: PluginSection
    algorithm: PluginSection
    model_groups: ModelGroups | None = None  # per-client architectures (raysim.config.model_groups)
    origin: JobOrigin | None = Field(None, exclude=True)  # set by load_jobs; not part of the config

    def to_dict(self) -> dict[str, Any]:
        """The resolved config in the shape of a job file (defaults filled in)."""
        out = self.model_dump(mode="json", exclude={*PLUGIN_SECTIONS, "model_groups"})
        for kind in PLUGIN_SECTIONS:
            out[kind] = getattr(self, kind).to_dict()
        out["evaluation"]["probes"] = [probe.to_dict() for probe in self.evaluation.probes]
        # left unset, they stay out: the config reads as before
        for optional in ("note", "system", "privacy", "compression", "robust", "attack"):
            if getattr(self, optional) is None:
                del out[optional]
        if self.model_groups is not None:
            out["model_groups"] = self.model_groups.to_dict()
        if self.evaluation.time_to_target is None:
            del out["evaluation"]["time_to_target"]
        if self.engine.selection is None:
            del out["engine"]["selection"]
        if self.engine.asynchrony is None:
            del out["engine"]["asynchrony"]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str | None = None) -> JobConfig:
        """Validates a job mapping; raises one ConfigError listing every problem."""
        return validate_job(raw, source)

    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Self:
        """``from_dict``: pydantic's own validation cannot see the plugins' Configs (each plugin
        section is validated by the Config its ``name`` picks), so a mapping goes through
        ``validate_job``; pydantic's ``options`` (strict, context) do not apply to a job."""
        job = obj if isinstance(obj, JobConfig) else validate_job(obj)
        assert isinstance(job, cls)
        return job


def noise_salt(job: JobConfig) -> int:
    """A 32-bit digest of what the job computes (its config but its name, ``RESUMABLE_CHANGES`` and
    how clients are batched, ``engine.vectorize``): mixed into every privacy mechanism's noise seed,
    so that two runs of different jobs never share noise (their difference would cancel it), while
    a run and its resume do."""
    how = (*RESUMABLE_CHANGES, "engine.vectorize")
    kept = {k: v for k, v in _flat(job.to_dict()).items() if not k.startswith(how)}
    kept.pop("name", None)
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (``raysim.config.flatten``, which imports this module)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= (
            _flat(value, f"{prefix}{key}.")
            if isinstance(value, dict) and value
            else {f"{prefix}{key}": value}
        )
    return out


def validate_job(raw: Any, source: str | None = None) -> JobConfig:
    """Turns a mapping into a JobConfig, collecting all problems before raising."""
    if not isinstance(raw, dict):
        raise ConfigError([f"a job must be a mapping of sections, got {type(raw).__name__}"], source)
    problems = _moved_keys(raw)
    raw = {**raw, "algorithm": refuse_renamed(raw.get("algorithm"), "algorithm", problems)}
    groups = None
    if "model_groups" in raw:
        groups = validate_model_groups(raw["model_groups"], problems)
        if "model" not in raw and groups is not None:  # the first group's model
            raw = {**raw, "model": groups.models[0].to_dict()}
    elif "model" not in raw and (default := plugin_default_model(raw)) is not None:
        raw = {**raw, "model": default}
    sections = {
        kind: validate_plugin(kind, raw.get(kind), problems)
        if kind != "model" or "model" in raw or groups is None and "model_groups" not in raw
        else None  # the groups' problems are said already
        for kind in PLUGIN_SECTIONS
    }
    problems += check_mixed_models(groups, sections["model"], sections["algorithm"])
    core_raw = {k: v for k, v in raw.items() if k not in (*PLUGIN_SECTIONS, "model_groups")}
    problems += [unknown_top_level_key(str(key)) for key in core_raw if key not in JobCore.model_fields]
    core_raw = {k: v for k, v in core_raw.items() if k in JobCore.model_fields}
    evaluation = core_raw.get("evaluation")
    probes: list[PluginSection | None] = []
    if isinstance(evaluation, dict) and "probes" in evaluation:
        core_raw["evaluation"] = {k: v for k, v in evaluation.items() if k != "probes"}
        probes = validate_probes(evaluation["probes"], problems)
    if isinstance(evaluation, dict):  # checked now, not after the training store is built
        _check_transfer_datasets(evaluation.get("transfer"), problems)
    core: JobCore | None = None
    try:
        core = JobCore.model_validate(core_raw)
    except ValidationError as exc:
        problems += explain(exc, JobCore)
    if core is not None:  # the sections that validated, against the job: reported with the rest
        problems += check_against_job([*sections.values(), *probes], core)
        engine = core.engine
        problems += sampling_problems(core.privacy, engine.sampling, engine.schedule, core.system is not None)
        problems += compression_problems(core.compression, sections["algorithm"], core.privacy)
        central = core.privacy is not None and core.privacy.central is not None
        guided = engine.selection is not None and engine.selection.kind == "power_of_choice"
        built = _built_algorithm(sections["algorithm"]) if core.robust or core.attack or guided else None
        problems += selection_problems(
            engine.selection, engine.cohort_size, engine.sampling, engine.schedule, central, built
        )
        problems += robust_problems(core.robust, core.attack, engine, central, built)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)), source)
    assert core is not None  # it validated, or it added a problem
    fields = dict(core)
    fields["evaluation"] = fields["evaluation"].model_copy(update={"probes": probes})
    job = JobConfig(**fields, **sections, model_groups=groups)
    if booleans := numbers_given_as_booleans(raw, job.to_dict()):
        raise ConfigError(booleans, source)
    return job


def numbers_given_as_booleans(raw: Any, resolved: Any, key: str = "") -> list[str]:
    """The keys where a job wrote a boolean (YAML reads yes, no, on, off as ones) and the config
    took a number: pydantic reads true as 1, so ``engine.num_rounds=yes`` ran one round."""
    if isinstance(raw, dict) and isinstance(resolved, dict):
        pairs = [(f"{key}{k}", v, resolved[k]) for k, v in raw.items() if k in resolved]
    elif isinstance(raw, list) and isinstance(resolved, list) and len(raw) == len(resolved):
        pairs = [(f"{key}{i}", v, w) for i, (v, w) in enumerate(zip(raw, resolved, strict=True))]
    elif isinstance(raw, bool) and isinstance(resolved, int | float) and not isinstance(resolved, bool):
        return [f"{key.rstrip('.')}: a number, not {str(raw).lower()} (YAML reads yes, no, on, off so)"]
    else:
        return []
    return [problem for name, v, w in pairs for problem in numbers_given_as_booleans(v, w, f"{name}.")]


def job_file_keys() -> list[str]:
    """Every top-level key a job file may hold."""
    return sorted({*JobCore.model_fields, *PLUGIN_SECTIONS, "model_groups", *FILE_KEYS})


def unknown_top_level_key(key: str) -> str:
    """The problem of a top-level key no job has, naming the nearest one and all of them."""
    if key in FILE_KEYS:
        return f"{key}: a job file's own section; set it at the file's top level, not in a variant"
    valid = job_file_keys()
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{key}: unknown key{hint} (valid keys: {', '.join(valid)})"


def _built_algorithm(section: PluginSection | None) -> tuple[str, object] | None:
    """The algorithm section's name and plugin, built to ask for its aggregator (a robust rule
    replaces a weighted mean only; power-of-choice needs an unweighted one); None where the
    section did not validate."""
    if section is None:
        return None
    return section.name, registry.get("algorithm", section.name).factory(section.config)


def plugin_default_model(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The model section of a job that names none: the algorithm plugin's ``DEFAULT_MODEL`` (the
    model it needs, as DENSE needs BatchNorm), else the dataset recipe's, else None (the job's
    ``model`` stays required). A job's own ``model`` always wins."""
    for kind in ("algorithm", "dataset"):
        section = raw.get(kind)
        name = section.get("name") if isinstance(section, dict) else None
        if isinstance(name, str) and name in registry.names(kind):
            default = default_model(registry.get(kind, name).factory)
            if default is not None:
                return default
    return None


def check_against_job(sections: list[PluginSection | None], job: JobCore) -> list[str]:
    """Each plugin Config's optional ``check_job(job: JobCore) -> list[str]``: the checks that need
    the job's own sections (IMA's ``average_from`` against ``engine.num_rounds``), so that the dry
    run reports them too, all at once, before any training."""
    problems: list[str] = []
    for section in sections:
        if section is not None:
            problems += job_problems(section.config, job)
    return problems


def probes_never_due(job: JobConfig) -> list[str]:
    """One warning per probe whose ``every`` exceeds the run's rounds: it would never measure
    (a probe is due after rounds every-1, 2*every-1, ...)."""
    rounds = job.engine.num_rounds
    return [
        f"evaluation.probes[{i}].every: {probe.name} measures every {every} rounds, but the run has "
        f"{rounds}, so it never runs; set every to at most {rounds}"
        for i, probe in enumerate(job.evaluation.probes)
        if (every := getattr(probe.config, "every", 1)) > rounds
    ]


def _check_transfer_datasets(raw: Any, problems: list[str]) -> None:
    """Each transfer dataset section validates like the job's own ``dataset``."""
    for i, transfer in enumerate(raw if isinstance(raw, list) else []):
        if isinstance(transfer, dict) and "dataset" in transfer:
            validate_plugin("dataset", transfer["dataset"], problems, f"evaluation.transfer[{i}].dataset")


def _moved_keys(raw: dict[str, Any]) -> list[str]:
    """One problem per key a job still sets in the section it moved out of."""
    problems = []
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        if isinstance(raw.get(section), dict) and key in raw[section]:
            problems.append(f"{old}: moved to {new}")
    return problems
