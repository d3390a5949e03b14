"""The local update's arithmetic in a worker: ``resources.precision`` (bf16 autocast) and
``resources.deterministic`` (deterministic kernels).

Usage:
    set_up_arithmetic(job.resources, device)   # a worker, once, before CUDA starts
    with local_precision(job.resources, device):
        result = algorithm.client_update(ctx)
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext

import torch

from raysim.config import ResourcesConfig
from raysim.errors import ResourceError

# cuBLAS's documented setting for reproducible results (CUDA >= 10.2): fixed workspaces.
_CUBLAS_WORKSPACE = ":4096:8"


def local_precision(resources: ResourcesConfig, device: torch.device) -> AbstractContextManager[None]:
    """The context a client's update runs in: nothing for fp32; for bf16, autocast on the
    worker's device, so matrix products and convolutions run in bfloat16 while the weights,
    their gradients and the update stay float32."""
    if resources.precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def set_up_arithmetic(resources: ResourcesConfig, device: torch.device) -> None:
    """Checks ``resources.precision`` against the device and switches deterministic kernels on."""
    check_precision(resources, device)
    use_deterministic_kernels(resources, device)


def check_precision(resources: ResourcesConfig, device: torch.device) -> None:
    """Refuses bf16 on a GPU without bfloat16 arithmetic, before training.

    Raises:
        ResourceError: naming the key and the card.
    """
    if resources.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise ResourceError(f"resources.precision: bf16, but {name} has no bfloat16 arithmetic; use fp32")


def use_deterministic_kernels(resources: ResourcesConfig, device: torch.device) -> None:
    """Switches torch to deterministic kernels in this process when ``resources.deterministic``
    (and sets cuBLAS's workspace, which it reads when CUDA starts, on a GPU)."""
    if not resources.deterministic:
        return
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
