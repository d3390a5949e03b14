"""Per-client architectures: the job's ``model_groups`` section gives clients different model
sections, by a deterministic rule on the client id (FuseFL's mixed ResNet-10/18/26).

    model_groups:
      assign: fractions                 # or round_robin (the default): client c gets group c % G
      fractions: [0.4, 0.2, 0.4]        # the groups' shares of the population (largest remainder)
      models:
        - {name: resnet10, width: 32}
        - {name: resnet18, width: 32}
        - {name: resnet26, width: 32}

With ``assign: fractions`` group g gets round(fraction_g x N) clients (largest remainder, ties to the
lower group), placed in client-id order after a permutation seeded by the run seed (``shuffle:
false``: in client-id order, clients 0.. to the first group). The job's ``model`` is one of the
groups' (by default the first): the driver's reference, whose initial parameters are the run's.
Only a plugin that declares ``MIXED_MODELS = True`` (FuseFL, the Ensemble) accepts groups of
different architectures; one that averages parameters is refused before any training. With mixed
architectures there is no one broadcast: each client starts from its architecture's initial model,
built from the run seed on every worker.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from raysim import registry
from raysim.config.plugins import PluginSection, accepts_mixed_models, explain, validate_plugin


class GroupRule(BaseModel, frozen=True, extra="forbid"):
    """How clients are assigned to the groups (the section without its ``models``)."""

    assign: Literal["round_robin", "fractions"] = "round_robin"
    fractions: tuple[float, ...] | None = None  # assign: fractions; one per model, summing to 1
    shuffle: bool = True  # assign: fractions; False: contiguous blocks of client ids

    @model_validator(mode="after")
    def _fractions_fit(self) -> GroupRule:
        if self.assign == "fractions":
            if self.fractions is None:
                raise ValueError("assign: fractions needs fractions: one share per model, summing to 1")
            if any(f <= 0 for f in self.fractions) or abs(sum(self.fractions) - 1) > 1e-6:
                raise ValueError(f"fractions {list(self.fractions)} must be positive and sum to 1")
        elif self.fractions is not None:
            raise ValueError("fractions is read only with assign: fractions; drop it or set assign")
        return self


class ModelGroups(BaseModel):
    """The client architectures (validated model sections) and the rule assigning clients to them."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    models: tuple[PluginSection, ...] = Field(min_length=1)
    rule: GroupRule = GroupRule()

    def to_dict(self) -> dict[str, Any]:
        return {**self.rule.model_dump(mode="json"), "models": [m.to_dict() for m in self.models]}

    @property
    def is_mixed(self) -> bool:
        """More than one distinct architecture (identical groups are one model)."""
        return len({model_key(m.to_dict()) for m in self.models}) > 1

    def group_of(self, num_clients: int, seed: int) -> np.ndarray:
        """Each client's group index, (num_clients,): a pure function of the rule, N and the seed."""
        num_groups = len(self.models)
        if self.rule.assign == "round_robin":
            return np.arange(num_clients) % num_groups
        shares = np.asarray(self.rule.fractions) * num_clients
        counts = np.floor(shares).astype(int)
        by_remainder = np.argsort(-(shares - counts), kind="stable")
        counts[by_remainder[: num_clients - counts.sum()]] += 1
        groups = np.repeat(np.arange(num_groups), counts)
        if self.rule.shuffle:  # a stream of its own ("model" in ASCII), apart from the partition's
            groups = groups[np.random.default_rng([seed, 0x6D6F64656C]).permutation(num_clients)]
        return groups

    def client_models(self, num_clients: int, seed: int) -> tuple[dict[str, Any], ...]:
        """Each client's model section, in client-id order."""
        sections = [m.to_dict() for m in self.models]
        return tuple(sections[g] for g in self.group_of(num_clients, seed))

    def empty_groups(self, num_clients: int, seed: int) -> list[str]:
        """One problem per group left without a client in a population of ``num_clients``."""
        counts = np.bincount(self.group_of(num_clients, seed), minlength=len(self.models))
        return [
            f"model_groups.models[{g}]: {num_clients} clients leave this group empty; "
            f"give it a larger fraction or drop it"
            for g in np.flatnonzero(counts == 0)
        ]


def model_key(section: dict[str, Any]) -> str:
    """A model section's identity (the key of a worker's resident models)."""
    return json.dumps(section, sort_keys=True, default=str)


def validate_model_groups(raw: Any, problems: list[str]) -> ModelGroups | None:
    """The ``model_groups`` section, its models validated like the job's ``model``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), list) or not raw["models"]:
        problems.append("model_groups.models: required, a non-empty list of model sections ({name: ...})")
        return None
    models = [
        validate_plugin("model", m, problems, f"model_groups.models[{i}]")
        for i, m in enumerate(raw["models"])
    ]
    rule = None
    try:
        rule = GroupRule.model_validate({k: v for k, v in raw.items() if k != "models"})
    except ValidationError as exc:
        problems += explain(exc, GroupRule, prefix="model_groups.")
    if rule is not None and rule.fractions is not None and len(rule.fractions) != len(models):
        problems.append(
            f"model_groups.fractions: {len(rule.fractions)} shares for {len(models)} models; "
            f"give one per model"
        )
        return None
    if rule is None or any(m is None for m in models):
        return None
    return ModelGroups(models=tuple(m for m in models if m is not None), rule=rule)


def check_mixed_models(
    groups: ModelGroups | None, model: PluginSection | None, algorithm: PluginSection | None
) -> list[str]:
    """The job's ``model`` is one of the groups (the driver's initial parameters fit some client),
    and a plugin that averages parameters needs one architecture: mixed groups are refused unless
    the plugin declares ``MIXED_MODELS = True``."""
    if groups is None or model is None or algorithm is None:
        return []
    if model_key(model.to_dict()) not in {model_key(m.to_dict()) for m in groups.models}:
        return [
            "model: with model_groups it must be one of the groups' models (the driver's reference "
            "and initial parameters); leave it out to use the first group's"
        ]
    if not groups.is_mixed:
        return []
    if accepts_mixed_models(registry.get("algorithm", algorithm.name).factory):
        return []
    return [
        f"model_groups: algorithm {algorithm.name!r} needs one architecture for every client (it "
        f"averages or shares parameters), but the groups name {len(groups.models)} different models; "
        f"drop model_groups (every client trains model), or use an algorithm that accepts mixed "
        f"models (fusefl)"
    ]
