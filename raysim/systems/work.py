"""The batches of a client's local work, as the simulated clock counts them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel

from raysim.train.local import LocalTrainConfig, round_epochs


@dataclass(frozen=True)
class LocalWork:
    """The batches of a client's local training, as ``raysim.train.local.train_local`` takes them:
    ``epochs`` passes in batches of ``batch_size`` (the last one of a pass smaller), at most
    ``max_steps`` batches."""

    epochs: int
    batch_size: int
    max_steps: int | None = None

    @classmethod
    def of(cls, config: LocalTrainConfig, round_num: int) -> LocalWork:
        return cls(round_epochs(config, round_num), config.batch_size, config.max_steps)

    def batches_per_epoch(self, num_examples: int) -> int:
        return -(-num_examples // self.batch_size)

    def steps(self, num_examples: int, epochs: int | None = None) -> int:
        """The batches of ``epochs`` (all the epochs when None) passes, capped by ``max_steps``."""
        steps = (self.epochs if epochs is None else epochs) * self.batches_per_epoch(num_examples)
        return steps if self.max_steps is None else min(steps, self.max_steps)

    def examples(self, num_examples: int, steps: int) -> int:
        """The examples ``steps`` batches visit: whole passes, then full batches of the next one."""
        per_epoch = self.batches_per_epoch(num_examples)
        if per_epoch == 0:
            return 0
        return (steps // per_epoch) * num_examples + (steps % per_epoch) * self.batch_size

    def steps_within(self, num_examples: int, budget: float) -> int:
        """The most batches whose examples fit in ``budget`` examples (a partial last batch of a
        pass needs the pass's remaining examples, which exceed the budget's remainder)."""
        if budget <= 0 or num_examples == 0:
            return 0
        passes = math.floor(budget / num_examples)
        rest = budget - passes * num_examples
        within = min(math.floor(rest / self.batch_size), self.batches_per_epoch(num_examples) - 1)
        return passes * self.batches_per_epoch(num_examples) + within


def local_training(config: BaseModel) -> LocalTrainConfig | None:
    """The first ``LocalTrainConfig`` in an algorithm's config (its ``local``, or a nested plugin's)."""
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, LocalTrainConfig):
            return value
        if isinstance(value, BaseModel) and (found := local_training(value)) is not None:
            return found
    return None
