"""Whether a job can train with sample-level DP (DP-SGD, ``privacy.sample``), checked before training.

DP-SGD acts inside the shared local trainer (``raysim.train.dp_sgd``): it reaches every plugin
whose clients train through ``train_client`` or ``train_context`` on the task loss, one gradient
per sampled batch, and sends nothing else computed from the examples. A plugin that does otherwise
cannot honour it, and a job pairing it with ``privacy.sample`` is refused with the reason:

- several gradients of one batch (SAM's two, a step per anchor), which the accountant counts once;
- a loss of its own (label counts, contrastive or anchor terms) that is not one example's alone;
- something else computed from the examples and uploaded without noise (peer scores, feature
  statistics, a window picked on held-back examples);
- more than one local training a round, whose steps ``train/steps`` does not count whole;
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
from raysim.train.dp_sgd import batch_statistics_problem

_SAM = "SAM takes two gradients of every batch (ascent, then descent), and the accountant counts one"
_ONE_SHOT = (
    "its clients' models come from the one-shot cache, which keys them without the privacy section, "
    "so a cached model may have trained without DP-SGD"
)
_SOUP = "it trains several ingredients a round and selects them on held-back examples without noise"
# plugins that cannot honour privacy.sample, by registered name, and why (read from each plugin)
REFUSED: dict[str, str] = {
    "fedsam": _SAM,
    "fedasam": _SAM,
    "fedgucci": "it steps once per anchor on every batch, and the accountant counts one gradient per batch",
    "fedgucci_plus": "it steps once per anchor on every batch, with SAM, and the accountant counts one",
    "moon": "its contrastive term (an extra_loss over the batch's representations) is no loss of one example",
    "fedlc": "its calibrated loss reads the client's label counts: one example's loss depends on the others",
    "fedrod": "its balanced loss reads the label counts; its personal head trains on plain gradients",
    "fedfa": "its anchor loss and the class-mean features it uploads read the examples without noise",
    "fedfomo": "it scores its peers on held-back examples and uploads the scores without noise",
    "fedrep": "it trains twice a round (head, then body), and its train/steps counts the body's steps alone",
    "lss": "its regulariser (an extra_loss) and its mixing step are no loss of one example alone",
    "soups": _SOUP,
    "diwa": _SOUP,
    "swad": "it picks its averaging window by the loss on held-back examples, without noise",
    "fusefl": "its stages train towers outside the round's model and its last uploads feature statistics",
    "oneshot_fedavg": _ONE_SHOT,
    "ensemble": _ONE_SHOT,
    "feddf": _ONE_SHOT,
    "dense": _ONE_SHOT,
}
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
        if (reason := _refusal(section)) is not None
    ]
    if job.engine.vectorize == "on":
        problems.append(
            "privacy.sample: engine.vectorize: on trains clients in chunks, which have no per-example "
            "gradients: set engine.vectorize to auto (DP-SGD clients then train one at a time) or off"
        )
    if model is not None and (problem := batch_statistics_problem(model)) is not None:
        problems.append(problem)
    return problems


def _refusal(section: PluginSection) -> str | None:
    """Why the plugin ``section`` names cannot honour DP-SGD; None: it trains through the seam."""
    if section.name == "fedfish" and getattr(section.config, "fisher_source", None) == "extra_pass":
        return (
            "its Fisher (fisher_source: extra_pass) squares plain gradients of the examples and is uploaded "
            "without noise; set fisher_source: last_epoch, which squares the private ones"
        )
    return REFUSED.get(section.name)


def _plugin_sections(section: PluginSection) -> list[PluginSection]:
    """``section`` and the plugins it wraps (a config field ``inner`` naming one, as IMA's)."""
    inner = getattr(section.config, "inner", None)
    return [section, *(_plugin_sections(inner) if isinstance(inner, PluginSection) else [])]
