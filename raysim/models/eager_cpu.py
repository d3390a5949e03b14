"""When a layer may take its own CPU path around torch's kernel (``max_pool``, ``dropout``): the
tensor is a plain strided float32/float64 CPU tensor and none of torch's program transforms is at
work. Under ``torch.func`` (``vmap`` of the vectorized trainer, per-example gradients) and
``torch.compile``, a layer's own code would need rules of its own there, so it stays torch's."""

from __future__ import annotations

import torch

_FAST_DTYPES = (torch.float32, torch.float64)


def eager_cpu_float(x: torch.Tensor) -> bool:
    """A strided CPU float32/float64 tensor, with no ``torch.func`` transform (over ``x`` or over
    the call: an input ``vmap`` does not batch) or ``torch.compile`` at work."""
    return (
        not torch.compiler.is_compiling()  # first: a traced call below would break the graph
        and x.device.type == "cpu"
        and x.layout == torch.strided
        and x.dtype in _FAST_DTYPES
        and not torch._C._are_functorch_transforms_active()
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
    )
