"""PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019, arXiv:1905.13727), one client's side.

Each tensor of two or more dimensions is read as the matrix ``M`` of its first dimension against
the rest (a conv kernel: out channels x in*kh*kw), and sent as the factors of one power iteration
on the Q kept from last round (drawn standard normal the first time): ``P = orth(M Q)``,
``Q' = M^T P``, decoded ``P Q'^T``, rank ``r = min(rank, n, m)``. Q' is kept for the next round
(the warm start). Vectors (biases, norms) go whole, as in the paper. Sent: ``(n + m) r`` values in
the tensor's dtype; a matrix whose factors would weigh as much as it does (``(n + m) r >= n m``)
goes whole, as PyTorch's PowerSGD hook sends it uncompressed. In the paper the workers all-reduce
P and Q; here each client's factors reach the server apart, which decodes and averages the
products.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raysim.compress.codec import Encoded, Memory, dense_bytes, whole


@dataclass(frozen=True)
class LowRank:
    rank: int

    def encode(self, tensor: torch.Tensor, memory: Memory, generator: torch.Generator) -> Encoded:
        if tensor.dim() < 2:
            return whole(tensor)
        matrix = tensor.reshape(tensor.shape[0], -1)
        (n, m), rank = matrix.shape, min(self.rank, *matrix.shape)
        sent = (n + m) * rank * tensor.element_size()
        if sent >= dense_bytes(tensor):  # (n + m) r >= n m: the factors weigh more than the matrix
            return whole(tensor)
        q = memory.get("q")
        # none yet, another shape, or zero (kept after a zero change): a zero Q spans nothing
        if q is None or q.shape != (m, rank) or not bool(q.any()):
            q = torch.randn(m, rank, generator=generator, device=generator.device, dtype=tensor.dtype)
        p = torch.linalg.qr(matrix @ q.to(tensor.device)).Q  # reduced: n x rank, orthonormal columns
        q = matrix.T @ p
        return Encoded((p @ q.T).reshape(tensor.shape), sent, {"q": q})
