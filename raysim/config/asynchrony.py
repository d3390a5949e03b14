"""``engine.asynchrony``: asynchronous FL on the simulated clock, FedBuff or FedAsync
(docs/systems.md, "Asynchronous FL"); ``raysim.systems.async_clock`` times the clients,
``raysim.engine.async_rounds`` runs the server steps."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator


class StalenessConfig(BaseModel, frozen=True, extra="forbid"):
    """How much an update ``tau`` server steps stale counts, s(tau) in (0, 1]: ``constant`` 1,
    ``polynomial`` (1 + tau)^-a (a 0.5 is FedBuff's 1/sqrt(1 + tau)), ``hinge`` 1 up to tau = b,
    then 1 / (a (tau - b) + 1) (Xie et al. 2019, sec. 5)."""

    kind: Literal["constant", "polynomial", "hinge"] = "polynomial"
    a: float = Field(0.5, ge=0)
    b: float = Field(4.0, ge=0)


class AsynchronyConfig(BaseModel, frozen=True, extra="forbid"):
    """``concurrency`` clients train at once, each starting when another finishes.

    ``fedbuff`` (Nguyen et al., AISTATS 2022): every ``buffer_size`` arrived updates, the plugin's
    ``server_update`` steps on their staleness-weighted mean delta (its server lr is FedBuff's
    eta_g). ``fedasync`` (Xie et al. 2019): each arriving client model is mixed in at once,
    ``x <- (1 - a_t) x + a_t x_client`` with ``a_t = mixing * s(tau)``.
    ``engine.num_rounds`` counts server steps.
    """

    kind: Literal["fedbuff", "fedasync"]
    concurrency: int = Field(10, ge=1)
    buffer_size: int | None = Field(None, ge=1)  # FedBuff's K; None: 10 (its paper's)
    staleness: StalenessConfig = StalenessConfig()
    mixing: float | None = Field(None, gt=0, le=1)  # FedAsync's alpha; None: 0.6 (its paper's)

    @model_validator(mode="after")
    def _options_of_its_kind(self) -> AsynchronyConfig:
        if self.kind == "fedasync" and self.buffer_size is not None:
            raise ValueError(
                "buffer_size: FedAsync mixes each update as it arrives; remove it (it is FedBuff's)"
            )
        if self.kind == "fedbuff" and self.mixing is not None:
            raise ValueError(
                "mixing: FedBuff steps with the plugin's server optimizer; remove it (it is FedAsync's)"
            )
        return self

    @property
    def updates_per_step(self) -> int:
        """The arrived updates one server step folds: K for FedBuff, 1 for FedAsync."""
        return (self.buffer_size or 10) if self.kind == "fedbuff" else 1

    @property
    def alpha(self) -> float:
        """FedAsync's mixing weight before staleness."""
        return self.mixing or 0.6
