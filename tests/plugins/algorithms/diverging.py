"""A test plugin: a built-in algorithm whose clients with ``client_id % every == 0`` go wrong.

``failure: diverge`` trains those clients at a huge learning rate (their updates turn NaN);
``failure: raise`` makes them raise instead. Both should drop the same clients. ``failure: stop``
receives a stop request (SIGTERM's SystemExit) in a class body being built, as torch's lazy
imports can: Python hands it on wrapped in a RuntimeError, and the run must still stop.
``failure: lost_stop`` notes a stop request whose exit is lost (as in a garbage-collection
callback) and trains on: the run must end at the next client. ``failure: changed_stop`` notes a
stop request and raises SystemExit(1), as Ray's ``ray.get`` does with the handler's exit: the run
must end with the stop's exit code. ``failure: lost_interrupt`` spends 50 ms per client in a block
that loses a KeyboardInterrupt landing in it (as a class body of torch's lazy imports, or a
library's broad ``except``, does) and trains on: a cancelled sweep cell must stop all the same.
The tests put this
folder on RAYSIM_PLUGIN_PATH (tests/conftest.py) so Ray workers load it too.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel

from raysim import registry
from raysim.config.plugins import update_delta
from raysim.stop_request import note_stop_request
from raysim.train.local import LocalTrainConfig
from raysim.types import ClientContext, ClientResult


class DivergingConfig(BaseModel, frozen=True, extra="forbid"):
    """Test plugin: some clients of a built-in algorithm diverge or raise."""

    inner: str = "fedavg"
    every: int = 7
    failure: Literal["diverge", "raise", "stop", "lost_stop", "changed_stop", "lost_interrupt"] = "diverge"
    local: LocalTrainConfig = LocalTrainConfig()

    def update_delta(self) -> str | None:
        """The inner algorithm's (``compression`` encodes it)."""
        entry = registry.get("algorithm", self.inner)
        return update_delta(entry.factory, entry.config(local=self.local))


@registry.register("algorithm", "diverging_test")
class Diverging:
    Config = DivergingConfig

    def __init__(self, config: DivergingConfig) -> None:
        entry = registry.get("algorithm", config.inner)
        self.config = config
        self.inner = entry.factory(entry.config(local=config.local))
        wild = config.local.model_copy(update={"lr": 1e30})
        self.wild = entry.factory(entry.config(local=wild))

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def client_update(self, ctx: ClientContext) -> ClientResult:
        if ctx.client_id % self.config.every:
            return self.inner.client_update(ctx)
        if self.config.failure == "raise":
            raise ValueError(f"client {ctx.client_id} fails on purpose")
        if self.config.failure == "lost_stop":
            note_stop_request(143)  # the handler's exit itself is lost: the run goes on here
            return self.inner.client_update(ctx)
        if self.config.failure == "changed_stop":
            note_stop_request(143)  # as Ray's ray.get runs the handler, catches its SystemExit(143)
            raise SystemExit(1)  # and raises this instead
        if self.config.failure == "lost_interrupt":
            try:
                time.sleep(0.05)
            except KeyboardInterrupt:  # lost here: the client trains on
                pass
            return self.inner.client_update(ctx)
        if self.config.failure == "stop":
            _StoppedWhileBuilt()  # RuntimeError: Error calling __set_name__ ..., from SystemExit(143)
        return self.wild.client_update(ctx)


class _Stop:
    def __set_name__(self, owner: type, name: str) -> None:
        raise SystemExit(143)  # what raysim's SIGTERM handler raises, landing here


def _StoppedWhileBuilt() -> None:
    """Builds a class whose body receives the stop (Python 3.11 wraps it in a RuntimeError)."""

    class Built:  # noqa: F841 (building the class is the point)
        field = _Stop()
