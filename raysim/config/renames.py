"""Plugin options renamed so that one word means one idea across plugins.

One table serves two readers. A job file that still sets an old key or value is refused, one
problem per old name, naming the new one (``refuse_renamed``). A job raysim itself wrote before
the renames (a checkpoint's job, a run's logged ``config/job.yaml``) is upgraded in place
(``upgrade_saved_job``), so that resuming or analysing an older run sees no change that the user
did not make.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

ANY_PLUGIN = "*"


@dataclass(frozen=True)
class Renamed:
    """``plugin``'s option ``old`` (dotted inside its section) is ``new`` now, its values renamed
    by ``values`` (old value -> new; values not listed keep their spelling)."""

    plugin: str  # a registered algorithm, or ANY_PLUGIN: every plugin with that option
    old: str
    new: str
    values: dict[Any, Any] = field(default_factory=dict)

    def applies_to(self, plugin: str) -> bool:
        return self.plugin in (plugin, ANY_PLUGIN)

    def hint(self, where: str) -> str:
        """What the refusal says: ``algorithm.penalty: renamed to algorithm.reading: paper (was
        squared) or fedgucci_code (was norm)``."""
        values = " or ".join(
            new if new == old else f"{new} (was {_spelled(old)})" for old, new in self.values.items()
        )
        if self.old == self.new:
            return f"{where}.{self.old}: value renamed: {values}"
        return f"{where}.{self.old}: renamed to {where}.{self.new}" + (f": {values}" if values else "")


def _spelled(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


_QUIRKS = {False: "paper", True: "fedgucci_code"}
_MOMENT = "server.initial_second_moment"
RENAMED: tuple[Renamed, ...] = (
    Renamed("fedgma", "variant", "reading", {"paper": "paper", "ima_code": "ima_code"}),
    Renamed("fedgma", "tau", "agreement_threshold"),
    Renamed("fedgucci", "replicate_quirks", "reading", _QUIRKS),
    Renamed("fedgucci_plus", "replicate_quirks", "reading", _QUIRKS),
    Renamed("feddyn", "penalty", "reading", {"squared": "paper", "norm": "fedgucci_code"}),
    Renamed("local", "init", "start_from", {"shared": "shared_init", "client": "client_init"}),
    Renamed("ima", "start_round", "average_from"),
    Renamed("moon", "negative", "negative", {"initial": "shared_init"}),
    *(
        Renamed(plugin, "logit_calibration.tau", "logit_calibration.strength")
        for plugin in ("fedgucci", "fedgucci_plus", "fedlc")
    ),
    Renamed(ANY_PLUGIN, _MOMENT, _MOMENT, {"tau_squared": "eps_squared"}),  # Reddi et al.'s epsilon
    # "from round t on" is X_from (or a schedule's from_round); start_round is the engine's first round
    Renamed("fedfa", "calibration_start_round", "calibrate_from"),
    Renamed("fedfa", "anchor_loss_start_round", "anchor_loss_from"),
    *(
        Renamed(ANY_PLUGIN, f"{schedule}.start_round", f"{schedule}.from_round")
        for schedule in ("local.lr_schedule", "local.epochs_schedule")
    ),
    Renamed("ima", "exploration.start_round", "exploration.from_round"),
    # "validation" is dataset.validation_fraction's split, fixed for the run; the examples a
    # soup or SWAD holds back each round to choose by, and those FedFomo scores peers on, differ
    *(Renamed(plugin, "validation_fraction", "selection_fraction") for plugin in ("soups", "diwa", "swad")),
    Renamed("fedfomo", "validation_fraction", "scoring_fraction"),
)


def refuse_renamed(section: Any, where: str, problems: list[str]) -> Any:
    """An algorithm section without what it sets under an old name, one problem for each, naming
    the new name (an IMA's ``inner`` section too). A plain key rename keeps the value under the new
    key, so that the section validates otherwise; everything else is left to validation."""
    if not isinstance(section, dict):
        return section
    kept = copy.deepcopy(section)
    for renamed in _for(kept):
        if _old_is_set(kept, renamed):
            value = _pop(kept, renamed.old)
            if not renamed.values and renamed.old != renamed.new:
                _put(kept, renamed.new, value)
            problems.append(renamed.hint(where))
    if isinstance(kept.get("inner"), dict):
        kept["inner"] = refuse_renamed(kept["inner"], f"{where}.inner", problems)
    return kept


def upgrade_saved_job(job: dict[str, Any]) -> dict[str, Any]:
    """A job dict raysim wrote before the renames, in today's names (unchanged when it has none)."""
    if not isinstance(job.get("algorithm"), dict):
        return job
    return {**job, "algorithm": _upgraded(job["algorithm"])}


def _upgraded(section: dict[str, Any]) -> dict[str, Any]:
    section = copy.deepcopy(section)
    for renamed in _for(section):
        if _old_is_set(section, renamed):
            value = _pop(section, renamed.old)
            _put(section, renamed.new, renamed.values.get(value, value) if _hashable(value) else value)
    if isinstance(section.get("inner"), dict):
        section["inner"] = _upgraded(section["inner"])
    return section


def _for(section: dict[str, Any]) -> list[Renamed]:
    return [renamed for renamed in RENAMED if renamed.applies_to(str(section.get("name")))]


def _old_is_set(section: dict[str, Any], renamed: Renamed) -> bool:
    """The old key is there; for a value-only rename, with an old value."""
    found, value = _get(section, renamed.old)
    if not found:
        return False
    if renamed.old == renamed.new:
        return _hashable(value) and value in renamed.values
    return True


def _get(section: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = section
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _pop(section: dict[str, Any], dotted: str) -> Any:
    *parents, last = dotted.split(".")
    node = section
    for key in parents:
        node = node[key]
    return node.pop(last)


def _put(section: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = section
    for key in parents:
        node = node.setdefault(key, {})
    node.setdefault(last, value)


def _hashable(value: Any) -> bool:
    return isinstance(value, str | bool | int | float) or value is None
