"""Errors raised by raysim. User errors are `RaysimError`s: the CLI prints them without a traceback."""

from __future__ import annotations


class RaysimError(Exception):
    """Base class of every error raysim raises on purpose."""


class ConfigError(RaysimError):
    """A job config is invalid. Holds every problem found, each with its dotted key."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        head = f"invalid config{f' {source}' if source else ''}"
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{head}:\n{lines}")

    def __reduce__(self) -> tuple:
        return ConfigError, (self.problems, self.source)


class DataError(RaysimError):
    """A dataset, client store or client index is missing or malformed."""


class ClientError(RaysimError):
    """A client's local computation failed; raised `from` the original exception."""

    def __init__(
        self, client_id: int, round_num: int, stage: str, cause: BaseException, raised_at: str = ""
    ) -> None:
        self.client_id = client_id
        self.round_num = round_num
        self.stage = stage
        self.cause = cause
        self.raised_at = raised_at  # the plugin's line: a worker's traceback does not reach the driver
        where = f" (raised at {raised_at})" if raised_at else ""
        super().__init__(
            f"client {client_id} failed in round {round_num} during {stage}: "
            f"{type(cause).__name__}: {cause}{where}"
        )

    def __reduce__(self) -> tuple:
        return ClientError, (self.client_id, self.round_num, self.stage, self.cause, self.raised_at)


class NonFiniteError(RaysimError):
    """NaN or infinity where the run needs finite numbers.

    In a client's update (a diverging client) it is a client failure, handled by
    ``engine.max_failed_clients``; in the server's aggregate or new global model it stops the run.
    """


class ResourceError(RaysimError):
    """The requested resources (workers, CPUs, GPUs) cannot be had."""


class CheckpointError(RaysimError):
    """A checkpoint is missing, unreadable, or does not match the job."""
