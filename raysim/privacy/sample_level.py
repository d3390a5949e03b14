"""Whether a job can train with sample-level DP (DP-SGD, ``privacy.sample``), checked before training.

DP-SGD acts inside the shared local trainer (``raysim.train.dp_sgd``): it reaches every plugin
whose clients train through ``train_client`` or ``train_context`` on the task loss, one gradient
per sampled batch, and sends nothing else computed from the examples. A plugin that does otherwise
cannot honour it: its Config says why in ``sample_privacy_problem()`` (read through
``raysim.config.plugins.sample_privacy_problem``), and a job pairing it with ``privacy.sample`` is
refused with that reason. The reasons so far:

- several gradients of one batch (SAM's two, a step per anchor), which the accountant counts once;
- a loss of its own (label counts, contrastive or anchor terms) that is not one example's alone;
- something else computed from the examples and uploaded without noise (peer scores, feature
  statistics, a window picked on held-back examples);
- more than one local training a round, of which it reports one's DP-SGD counts;
- local models reused from the one-shot cache, which keys them without the privacy section.

The vectorized trainer has no per-example gradients: ``engine.vectorize: on`` is refused (``auto``
trains such a job one client at a time). A model with BatchNorm in train mode is refused too. The
shared trainer checks the first two, and BatchNorm, again at run time, whatever the plugin.

Usage:
    if problems := sample_privacy_problems(job, model):   # the driver, at build time
        raise ConfigError(problems)
"""

from __future__ import annotations

from torch import nn

from raysim.config import JobConfig, PluginSection
from raysim.config.plugins import sample_privacy_problem
from raysim.train.dp_sgd import batch_statistics_problem

_FIX = "use a plugin that trains on the task loss (fedavg, fedprox, scaffold, ...), or drop privacy.sample"


def sample_privacy_problems(job: JobConfig, model: nn.Module | None = None) -> list[str]:
    """Why ``job`` cannot train with ``privacy.sample`` (empty: it can, or it sets none).

    Args:
        job: the job; its algorithm section is followed into wrapped plugins (IMA's ``inner``).
        model: the job's model as built (train mode); None skips the BatchNorm check.

    Returns:
        One problem per part in the way, each naming it and the fix.
    """
    if job.privacy is None or job.privacy.sample is None:
        return []
    problems = [
        f"privacy.sample: algorithm {section.name!r} cannot honour DP-SGD: {reason}; {_FIX}"
        for section in _plugin_sections(job.algorithm)
        if (reason := sample_privacy_problem(section.config)) is not None
    ]
    if job.engine.vectorize == "on":
        problems.append(
            "privacy.sample: engine.vectorize: on trains clients in chunks, which have no per-example "
            "gradients: set engine.vectorize to auto (DP-SGD clients then train one at a time) or off"
        )
    if model is not None and (problem := batch_statistics_problem(model)) is not None:
        problems.append(problem)
    return problems


def _plugin_sections(section: PluginSection) -> list[PluginSection]:
    """``section`` and the plugins it wraps (a config field ``inner`` naming one, as IMA's)."""
    inner = getattr(section.config, "inner", None)
    return [section, *(_plugin_sections(inner) if isinstance(inner, PluginSection) else [])]
