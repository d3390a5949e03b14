"""Job configs: YAML -> typed, frozen values, with every problem reported at once.

A job file holds values only. Its ``dataset``, ``model`` and ``algorithm`` sections each name a
registered plugin (``name:``) and carry that plugin's own options, validated by the plugin's
``Config``. An optional top-level ``variants:`` list runs the same job several times, each variant
deep-merged over the base (``raysim run`` logs one MLflow run per variant and compares them).

Usage:
    jobs = load_jobs("jobs/quickstart.yaml", ["engine.num_rounds=5"])
    job = jobs[0]; job.algorithm.name, job.algorithm.config.local.lr

The rooms: ``job`` (``JobConfig``, validated whole), ``sections`` (the job's own sections),
``system`` (the clients as devices), ``privacy`` (differential privacy), ``plugins`` (sections
that name a plugin, and error wording), ``files`` (YAML, variants, overrides), ``overrides``
(``VARIANT:key=value`` and ``!unset``).
The names below are the config's public API.
"""

from raysim.config.files import apply_overrides, deep_merge, flatten, load_jobs
from raysim.config.job import JobConfig, JobCore, JobOrigin, probes_never_due, validate_job
from raysim.config.plugins import PluginSection, explain, nested_plugin
from raysim.config.privacy import PrivacyConfig
from raysim.config.sections import (
    EngineConfig,
    EvaluationConfig,
    PersonalizationConfig,
    ResourcesConfig,
    TimeToTargetConfig,
    TrackingConfig,
    TransferConfig,
)
from raysim.config.system import SystemConfig

__all__ = [
    "EngineConfig",
    "EvaluationConfig",
    "JobConfig",
    "JobCore",
    "JobOrigin",
    "PersonalizationConfig",
    "PluginSection",
    "PrivacyConfig",
    "ResourcesConfig",
    "SystemConfig",
    "TimeToTargetConfig",
    "TrackingConfig",
    "TransferConfig",
    "apply_overrides",
    "deep_merge",
    "explain",
    "flatten",
    "load_jobs",
    "nested_plugin",
    "probes_never_due",
    "validate_job",
]
