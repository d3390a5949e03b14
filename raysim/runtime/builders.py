"""The job's plugins and model, built the same way on the driver and on every worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from raysim import registry
from raysim.algorithm import check_shape
from raysim.config import JobConfig, PluginSection
from raysim.errors import ConfigError
from raysim.types import DataSpec

if TYPE_CHECKING:
    from raysim.algorithm import AnyAlgorithm
    from raysim.probe import Probe


def build_algorithm(job: JobConfig) -> AnyAlgorithm[Any]:
    """The job's plugin; its aggregate type is known only to the plugin (looked up by name).

    Raises:
        TypeError: a plugin with neither of the contract's shapes, naming what it lacks.
    """
    algorithm = registry.get("algorithm", job.algorithm.name).factory(job.algorithm.config)
    check_shape(job.algorithm.name, algorithm)
    return algorithm


def job_plugins(job: JobConfig) -> list[tuple[registry.Kind, str]]:
    """The plugins a worker builds for ``job``: its algorithm, models and probes."""
    groups = job.model_groups.models if job.model_groups is not None else ()
    return [
        ("algorithm", job.algorithm.name),
        ("model", job.model.name),
        *(("model", section.name) for section in groups),
        *(("probe", section.name) for section in job.evaluation.probes),
    ]


def build_probes(job: JobConfig) -> dict[str, Probe]:
    """The job's probes by name (``evaluation.probes``)."""
    return {section.name: _build(section, "probe") for section in job.evaluation.probes}


def _build(section: PluginSection, kind: registry.Kind) -> Any:
    return registry.get(kind, section.name).factory(section.config)


def build_job_model(job: JobConfig, spec: DataSpec, seed: int | None = None) -> torch.nn.Module:
    """The job's model, seeded (by ``job.seed`` unless ``seed`` is given) so every process builds
    identical weights.

    Raises:
        ConfigError: the model does not fit the dataset, or its pretrained files are missing.
    """
    from raysim.models import build_model

    torch.manual_seed(job.seed if seed is None else seed)
    try:
        return build_model(job.model.name, job.model.config, spec)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(
            [
                f"model: {job.model.name!r} cannot be built for dataset "
                f"{job.dataset.name!r} ({spec.task}, input {spec.input_shape}, "
                f"{spec.num_classes} classes): {exc}"
            ]
        ) from exc


def build_section_model(job: JobConfig, section: dict[str, Any], spec: DataSpec) -> torch.nn.Module:
    """The model of a model section ({name: ..., **options}: a ``model_groups`` entry, or a model
    a plugin composes), seeded by ``job.seed`` as the job's model is: every process builds
    identical weights, and a section equal to the job's ``model`` builds the job's model.

    Raises:
        ConfigError: the model does not fit the dataset, or its options are not the plugin's.
    """
    from raysim.models import build_model

    entry = registry.get("model", str(section["name"]))
    config = entry.config.model_validate({k: v for k, v in section.items() if k != "name"})
    torch.manual_seed(job.seed)
    try:
        return build_model(entry.name, config, spec)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(
            [f"model {section['name']!r} cannot be built for dataset {job.dataset.name!r}: {exc}"]
        ) from exc
