"""A job's ``compression.download`` made into the server's downlink (``raysim.compress.downlink``),
its state saved with a checkpoint and restored from one."""

from __future__ import annotations

from raysim.checkpoint import Checkpoint
from raysim.compress.downlink import Downlink
from raysim.compress.upload import encoder_of
from raysim.config import JobConfig


def open_downlink(job: JobConfig, checkpoint: Checkpoint | None) -> Downlink | None:
    """The run's downlink (None: the broadcast goes whole); where the run resumes, as the
    checkpoint left it. A checkpoint without one (a run that sent its broadcast whole) starts it
    afresh: the clients are taken to hold the model the run resumes from."""
    config = job.compression.download if job.compression is not None else None
    if config is None:
        return None
    downlink = Downlink(encoder_of(config), job.seed)
    if checkpoint is not None and isinstance(checkpoint.downlink, dict):
        downlink.restore(checkpoint.downlink)
    return downlink
