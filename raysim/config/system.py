"""The job's ``system:`` section: availability, devices, deadlines, stragglers (docs/systems.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator


class AlwaysAvailable(BaseModel, frozen=True, extra="forbid"):
    """Every client is available at every moment (the default)."""

    kind: Literal["always"] = "always"


class DiurnalAvailability(BaseModel, frozen=True, extra="forbid"):
    """Each client is online for ``online_fraction`` of every ``period_s`` seconds, from a phase
    drawn uniformly in ``[0, period_s)`` per client from the seed: a day/night pattern whose
    online windows are spread over the day (FedScale's traces show such diurnal availability)."""

    kind: Literal["diurnal"] = "diurnal"
    period_s: float = Field(86400.0, gt=0)
    online_fraction: float = Field(0.5, gt=0, le=1)


class TraceAvailability(BaseModel, frozen=True, extra="forbid"):
    """Availability intervals per client from a JSON file (format in docs/systems.md).

    ``missing`` says what a client the trace does not list does: ``error`` refuses the job,
    ``always`` makes it always available, ``cycle`` gives it the intervals of the listed client
    ``sorted(listed)[id % len(listed)]`` (for traces of fewer devices than clients).
    """

    kind: Literal["trace"] = "trace"
    path: str
    missing: Literal["error", "always", "cycle"] = "error"


class LognormalDevices(BaseModel, frozen=True, extra="forbid"):
    """Per-client speed and bandwidth drawn once from the seed: ``median * exp(sigma * z)``,
    ``z`` standard normal (sigma 0: every device alike). Stated assumptions, not measurements."""

    kind: Literal["lognormal"] = "lognormal"
    examples_per_s: float = Field(100.0, gt=0)  # the median device's training speed
    examples_per_s_sigma: float = Field(0.5, ge=0)
    bytes_per_s: float = Field(1.25e6, gt=0)  # the median bandwidth (10 Mbit/s), up and down
    bytes_per_s_sigma: float = Field(0.5, ge=0)


class TraceDevices(BaseModel, frozen=True, extra="forbid"):
    """Per-client ``examples_per_s`` and ``bytes_per_s`` from a JSON file (docs/systems.md);
    ``missing``: ``error``, or ``cycle`` through the listed devices as ``TraceAvailability``."""

    kind: Literal["trace"] = "trace"
    path: str
    missing: Literal["error", "cycle"] = "error"


AvailabilityConfig = Annotated[
    AlwaysAvailable | DiurnalAvailability | TraceAvailability, Field(discriminator="kind")
]
DevicesConfig = Annotated[LognormalDevices | TraceDevices, Field(discriminator="kind")]


class SystemConfig(BaseModel, frozen=True, extra="forbid"):
    """The clients as devices: when they are online, how fast they train and send, who straggles.

    Absent (the default), rounds take no simulated time and every drawn client trains.
    """

    availability: AvailabilityConfig = AlwaysAvailable()
    devices: DevicesConfig = LognormalDevices()
    over_commit: float = Field(1.0, ge=1)  # draw this many times cohort_size; keep the first to report
    deadline_s: float | None = Field(None, gt=0)  # clients not done by then are dropped
    dropout: float = Field(0.0, ge=0, lt=1)  # each drawn client drops out with this probability
    straggler_fraction: float = Field(0.0, ge=0, le=1)  # FedProx: these do random epochs in [1, E]
    partial_work: bool = False  # who cannot finish in time does what fits, instead of being dropped

    @field_validator("devices", mode="before")
    @classmethod
    def _lognormal_unless_named(cls, raw: Any) -> Any:
        return {"kind": "lognormal", **raw} if isinstance(raw, dict) and "kind" not in raw else raw
