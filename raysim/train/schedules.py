"""Round-dependent client schedules: the local learning rate, and the local epochs, of round t.

Every schedule is a pure function of its config and the round, so every worker, which builds its
plugin from the job config, trains at the same lr in the same round (``raysim.algorithm``). An lr
schedule scales the lr it starts from, ``lr0`` (``LocalTrainConfig.lr``); ``switch`` chains two
of them, the second starting from the lr the first reached.

- ``exponential``: ``lr0 * decay^t``, the per-round decay of FedAvg-style experiments (IMA's
  baselines use 0.99: Zhou et al., IEEE TMC 2024, arXiv:2305.07845, Table VII and Sec. 6.3).
- ``constant``: ``lr0``, or a fixed ``lr`` (IMA's "small constant lr" ablation, CLR, 5e-5).
- ``cyclic``: between ``lr0`` and ``lr_min`` every ``period`` rounds (IMA's CD ablation).
- ``step``: ``lr0 * factor^floor(t / every)`` (IMA's stage decay, SD: halve every 20 rounds).
- ``switch``: ``before`` until ``from_round``, then ``after`` from the lr reached, without a
  reset. IMA's "mild client exploration" (IMA paper, Sec. 6.3) is ``switch`` from ``exponential 0.99`` to
  ``exponential 0.97``: ``lr_t = lr0 * 0.99^t_s * 0.97^(t - t_s)`` for ``t >= t_s``.
- ``EpochDecay`` (``LocalTrainConfig.epochs_schedule``): one epoch fewer every ``every`` rounds
  from ``from_round`` on, down to ``min_epochs`` (IMA's epoch-decay ablation, ED).

Usage:
    schedule = Switch(from_round=225, before=Exponential(decay=0.99), after=Exponential(decay=0.97))
    schedule.value(0.01, 230)  # 0.01 * 0.99**225 * 0.97**5
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field


class Exponential(BaseModel, frozen=True, extra="forbid"):
    """``lr0 * decay^t``: the lr shrinks by the factor ``decay`` every round."""

    kind: Literal["exponential"] = "exponential"
    decay: float = Field(gt=0, le=1)

    def value(self, lr0: float, round_num: int) -> float:
        return lr0 * self.decay**round_num


class Constant(BaseModel, frozen=True, extra="forbid"):
    """The same lr every round: ``lr0``, or ``lr`` when set (IMA's CLR ablation uses 5e-5)."""

    kind: Literal["constant"] = "constant"
    lr: float | None = Field(None, gt=0, allow_inf_nan=False)

    def value(self, lr0: float, round_num: int) -> float:
        return lr0 if self.lr is None else self.lr


class Cyclic(BaseModel, frozen=True, extra="forbid"):
    """From ``lr0`` down to ``lr_min`` and again, every ``period`` rounds (IMA's CD ablation).

    ``sawtooth`` (the IMA paper's words, Sec. 7.3.2: "decaying lr from lr_max to lr_min every 20
    rounds") falls linearly to ``lr_min`` at the period's last round and restarts at ``lr0``;
    ``triangle`` (what the author code means) falls over the first half and climbs back over the
    second (the code's second half overshoots ``lr0``; here it ends where the next period starts).
    """

    kind: Literal["cyclic"] = "cyclic"
    lr_min: float = Field(gt=0, allow_inf_nan=False)
    period: int = Field(20, ge=2)
    shape: Literal["sawtooth", "triangle"] = "sawtooth"

    def value(self, lr0: float, round_num: int) -> float:
        phase = round_num % self.period
        if self.shape == "sawtooth":
            fraction = phase / (self.period - 1)
        else:
            half = self.period / 2
            fraction = phase / half if phase < half else (self.period - phase) / half
        return lr0 - (lr0 - self.lr_min) * fraction


class Step(BaseModel, frozen=True, extra="forbid"):
    """``lr0 * factor^floor(t / every)``: stage decay (IMA's SD halves every 20 rounds)."""

    kind: Literal["step"] = "step"
    factor: float = Field(0.5, gt=0, le=1)
    every: int = Field(20, ge=1)

    def value(self, lr0: float, round_num: int) -> float:
        return lr0 * self.factor ** (round_num // self.every)


class Switch(BaseModel, frozen=True, extra="forbid"):
    """``before`` until ``from_round``; from then on ``after``, counting rounds from the switch
    and starting from the lr ``before`` reached there (no reset: IMA's regime switch)."""

    kind: Literal["switch"] = "switch"
    from_round: int = Field(ge=0)
    before: Schedule = Constant()
    after: Schedule

    def value(self, lr0: float, round_num: int) -> float:
        if round_num < self.from_round:
            return self.before.value(lr0, round_num)
        reached = self.before.value(lr0, self.from_round)
        return self.after.value(reached, round_num - self.from_round)


Schedule = Annotated[Exponential | Constant | Cyclic | Step | Switch, Field(discriminator="kind")]
Switch.model_rebuild()


class EpochDecay(BaseModel, frozen=True, extra="forbid"):
    """Local epochs ``max(E - floor((t - from_round) / every), min_epochs)`` from ``from_round`` on,
    ``E`` before: IMA's epoch-decay ablation, ED (IMA paper, Sec. 7.3.2, Table III; ``E <- max(E -
    1, 1)`` every 20 rounds, the first cut 20 rounds after the start, as in the author code)."""

    from_round: int = Field(0, ge=0)
    every: int = Field(20, ge=1)
    min_epochs: int = Field(1, ge=1)

    def epochs(self, epochs: int, round_num: int) -> int:
        if round_num < self.from_round:
            return epochs
        cuts = (round_num - self.from_round) // self.every
        return max(epochs - cuts, min(self.min_epochs, epochs))
