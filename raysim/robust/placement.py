"""Where the driver applies a robust rule, and in how wide column chunks (docs/robustness.md).

The rules run on the GPU the workers train on when the driver's process sees it: under the serial
backend it is the workers' process, and under a single-node Ray the driver sees the card too (Ray
narrows ``CUDA_VISIBLE_DEVICES`` in its actors only). A driver without one (a cluster's head
node) runs them on its CPU and says so once. ``robust.memory_mb`` bounds the release's memory on
that device, the ``n x d`` float32 rows included; the column chunks take what the rows leave.

Usage:
    device, note = release_device(job)            # before training: refuses cuda without a GPU
    chunk = column_chunk(n, d, device, rule.memory_mb)   # raises where the rows do not fit
    device, chunk, note = placed(n, d, device, rule)     # auto: the CPU where the card has no room
"""

from __future__ import annotations

import torch

from raysim.config.job import JobConfig
from raysim.config.robust import RobustConfig
from raysim.errors import ResourceError
from raysim.robust import rules

MiB = 2**20
ROW_BYTES = 4  # float32
CHUNK_BYTES = 24  # per n x chunk value: its float32 slice and sorted copy, int64 indices, float64 sums
VECTOR_BYTES = 32  # per coordinate: the (d,) float64 vectors a rule holds (v, its next, the output)
PAIR_BYTES = 32  # per pair of rows: Krum's n x n float64 distances, their masked and sorted copies
CUDA_SHARE = 0.8  # of the card's free memory, where robust.memory_mb is unset (allocator slack)


def release_device(job: JobConfig) -> tuple[torch.device, str]:
    """The device the job's rule runs on (``robust.device``), and a console line where ``auto``
    falls back to the CPU though the workers train on GPUs.

    Raises:
        ResourceError: ``robust.device: cuda`` where this process sees no CUDA device.
    """
    setting = job.robust.device if job.robust is not None else "auto"
    cuda = torch.cuda.is_available()
    if setting == "cuda" and not cuda:
        raise ResourceError(
            "robust.device: cuda, but the driver's process sees no CUDA device; set robust.device "
            "to auto (the workers' GPU where the driver sees it, else its CPU) or cpu"
        )
    trains_on_gpu = job.resources.gpus_per_worker == "auto" or job.resources.gpus_per_worker > 0
    if setting == "cpu" or (setting == "auto" and not trains_on_gpu):
        return torch.device("cpu"), ""
    if cuda:
        return torch.device("cuda"), ""
    return torch.device("cpu"), (
        "robust: the workers train on GPUs but the driver's process sees none; the rule runs on "
        "the driver's CPU (robust.device: cpu chooses it without this line)"
    )


def column_chunk(n: int, d: int, device: torch.device, memory_mb: float | None) -> int:
    """Coordinates per column chunk for ``n`` rows of ``d`` on ``device`` within ``memory_mb``
    (None: 80% of a card's free memory; on the CPU today's ``rules.TEMPORARY_VALUES``).

    Raises:
        ResourceError: the rows and one coordinate's temporaries do not fit the budget.
    """
    if memory_mb is None and device.type != "cuda":
        return rules.column_chunk(n)  # the rows are in the driver's memory already
    budget = memory_mb * MiB if memory_mb is not None else CUDA_SHARE * free_bytes(device)
    spare = budget - resident_bytes(n, d)
    chunk = int(spare // (n * CHUNK_BYTES))
    if chunk < 1:
        given = (
            f"robust.memory_mb={memory_mb:g}" if memory_mb is not None else "80% of the card's free memory"
        )
        raise ResourceError(
            f"robust: the round's {n} updates of {d:,} values take {n * d * ROW_BYTES / MiB:,.0f} MiB "
            f"as float32 rows, {(resident_bytes(n, d) + n * CHUNK_BYTES) / MiB:,.0f} MiB with the rule's "
            f"least temporaries, over the {budget / MiB:,.0f} MiB {given} gives on {device}; raise "
            f"robust.memory_mb, lower engine.cohort_size, or set robust.device: cpu"
        )
    return min(chunk, d)


def placed(n: int, d: int, device: torch.device, rule: RobustConfig | None) -> tuple[torch.device, int, str]:
    """``column_chunk`` on ``device``; where ``robust.device: auto`` finds no room on the card for
    the rows (and sets no ``memory_mb``), the CPU's instead, with a console line saying so."""
    memory_mb = rule.memory_mb if rule is not None else None
    try:
        return device, column_chunk(n, d, device, memory_mb), ""
    except ResourceError:
        setting = rule.device if rule is not None else "auto"
        if device.type != "cuda" or setting != "auto" or memory_mb is not None:
            raise
    cpu = torch.device("cpu")
    note = (  # the same line every round, so said once a run whatever the round's n
        "robust: a round's updates do not fit the card's free memory; the rule runs on the "
        "driver's CPU where they do not (robust.device: cuda or robust.memory_mb say their size)"
    )
    return cpu, column_chunk(n, d, cpu, None), note


def resident_bytes(n: int, d: int) -> int:
    """What the release holds on its device whatever the chunk: the rows, the rule's (d,) float64
    vectors, Krum's distances."""
    return n * d * ROW_BYTES + d * VECTOR_BYTES + n * n * PAIR_BYTES


def free_bytes(device: torch.device) -> int:
    """The card's free memory and what this process's allocator caches unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def stacked(vectors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The rows (n, d) float32 on ``device``: each copied there once, with no second ``n x d``
    stack on the host on the way."""
    x = torch.empty((len(vectors), vectors[0].numel()), dtype=torch.float32, device=device)
    for row, vector in zip(x, vectors, strict=True):
        row.copy_(vector)
    return x
