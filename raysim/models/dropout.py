"""Dropout whose CPU mask is a uniform draw compared with the keep rate: ``nn.Dropout`` otherwise.

torch draws a CPU dropout mask with ``bernoulli_``, which spends a 64-bit draw and double
arithmetic on each element: 888 us for the 125,440 elements after pfl's CNN's pool, on one core,
against 302 us for ``torch.rand_like(x) < keep``, one 32-bit draw an element (medians of 200
calls on the 2-core VM), about 3 ms of a client's 70-85 ms on the CPU benchmark's shape. Both
masks are independent Bernoulli draws from torch's default generator, so both are a pure
function of the seed a client's training sets (``torch.manual_seed``); a float32 uniform is a
multiple of 2**-24 and is compared with ``1 - p`` rounded to float32, so an element is kept with
probability ``1 - p`` to within 2**-24. They are not the same draws: a model trains to another,
equally distributed result than with ``nn.Dropout``.
Kept elements are scaled as torch scales them, ``x * (mask / (1 - p))``, and the gradient is the
output's times the same scaled mask.

Where the fast path does not apply it is ``nn.Dropout`` itself: in evaluation, for ``p`` of 0 or 1,
``inplace``, on a GPU (torch's fused kernel), for an input other than a strided float32 or float64
tensor (so under ``resources.precision: bf16``, whose activations are bfloat16), inside
``torch.func`` transforms (the vectorized trainer hashes each client's masks instead:
``raysim.train.hashed_dropout``) and under ``torch.compile``.
"""

from __future__ import annotations

import torch
from torch import nn

from raysim.models.eager_cpu import eager_cpu_float


class Dropout(nn.Dropout):
    """``nn.Dropout`` with its CPU mask drawn from a uniform (module docstring). A drop-in
    subclass: same arguments, no parameters or buffers, ``isinstance(m, nn.Dropout)``."""

    hashes_as_nn_dropout = True  # its law is nn.Dropout's: the vectorized trainer may hash its masks

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and 0 < self.p < 1) or self.inplace or not eager_cpu_float(input):
            return super().forward(input)
        keep = 1.0 - self.p
        noise = torch.rand_like(input).lt_(keep)  # 1.0 where kept, in the input's dtype and layout
        return input * noise.div_(keep)
