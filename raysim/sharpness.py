"""Sharpness-aware minimization as a ``train_local`` step: SAM and ASAM.

SAM (Foret et al., ICLR 2021, arXiv:2010.01412) minimises ``max_{||e||_2 <= rho} L(w + e)``. The
first-order solution of the inner maximum is ``e = rho g / ||g||_2`` with ``g = grad L(w)``, and
the gradient of the outer problem is taken at the perturbed point, so one batch costs two
backward passes:

    g = grad L(w);   e = rho g / ||g||_2;   w <- optimizer step from w with grad L(w + e)

ASAM (Kwon et al., ICML 2021, arXiv:2102.11600) measures the neighbourhood relative to the
weights' scale with ``T_w = |w| + eta`` (elementwise): ``e = rho T_w^2 g / ||T_w g||_2``. As in
the authors' code, ``T_w`` applies to parameters whose name contains "weight"; the others
(biases) keep ``T_w = 1``. Their code's defaults are rho 0.5 and eta 0.01; SAM's usual rho is 0.05.

The norm runs over every parameter with a gradient, as one vector. Because the step goes
through ``train_local``'s ``backward``, both passes include ``extra_loss``, ``after_backward`` and
clipping (a global clip rescales g, which leaves ``e`` unchanged).

Usage:
    metrics = train_local(model, data, config, seed=s, spec=spec, step=sam_step(rho=0.05))
    result = local_delta_update(ctx, config, step=sam_step(rho=0.5, adaptive=True))  # ASAM
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from raysim.local import Backward, Batch, BatchLoss, LocalStep

_TINY = 1e-16  # keeps e finite (zero) when the gradient is zero


def sam_step(rho: float, adaptive: bool = False, *, eta: float = 0.01) -> LocalStep:
    """A ``LocalStep`` taking SAM's (or, with ``adaptive``, ASAM's) update on every batch.

    Args:
        rho: radius of the neighbourhood; 0 gives the plain gradient step at twice the cost.
        adaptive: ASAM's scale-invariant neighbourhood instead of SAM's ball.
        eta: ASAM's offset in ``T_w = |w| + eta``; unused by SAM.

    Raises:
        ValueError: ``rho`` or ``eta`` is negative.
    """
    if rho < 0 or eta < 0:
        raise ValueError(f"sam_step: rho and eta must be >= 0, got rho={rho}, eta={eta}")

    def step(
        model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, backward: Backward
    ) -> BatchLoss:
        loss = backward(batch)  # grad L(w)
        with sam_perturbation(model, rho, adaptive, eta=eta):
            backward(batch)  # grad L(w + e), left in .grad after the weights return to w
        optimizer.step()
        return loss

    return step


@contextlib.contextmanager
def sam_perturbation(
    model: nn.Module, rho: float, adaptive: bool = False, *, eta: float = 0.01
) -> Iterator[None]:
    """Moves the weights to ``w + e``, SAM's (ASAM's) ascent point, for the ``with`` block.

    ``e`` is computed from the gradients in ``.grad`` on entry (those at ``w``). On exit the
    weights are restored exactly and so are the buffers: the pass at ``w + e`` is only there for
    its gradient, so the BatchNorm statistics it updated are discarded. Use it to wrap any pass,
    e.g. FedGuCci+'s connectivity steps:

        backward(batch, loss_fn=connectivity)
        with sam_perturbation(model, rho):
            backward(batch, loss_fn=connectivity)
        optimizer.step()
    """
    params = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
    if not params:  # nothing to perturb (no gradient reached the weights)
        yield
        return
    grads = [g for _, p in params if (g := p.grad) is not None]  # every one: params has a .grad
    saved = [p.detach().clone() for _, p in params]
    buffers = [b.detach().clone() for b in model.buffers()]
    with torch.no_grad():
        scales = [p.abs() + eta if adaptive and "weight" in name else None for name, p in params]
        scaled = [g if t is None else g * t for g, t in zip(grads, scales, strict=True)]  # T g
        norm = torch.linalg.vector_norm(
            torch.stack(
                [
                    torch.linalg.vector_norm(g, dtype=torch.promote_types(g.dtype, torch.float32)).float()
                    for g in scaled
                ]
            )
        )
        factor = rho / (norm + _TINY)  # a tensor: no device sync
        for (_, p), t, g in zip(params, scales, scaled, strict=True):
            p.add_((g if t is None else g * t) * factor)  # rho T^2 g / ||T g||
    try:
        yield
    finally:
        with torch.no_grad():
            for (_, p), value in zip(params, saved, strict=True):
                p.copy_(value)
            for buffer, value in zip(model.buffers(), buffers, strict=True):
                buffer.copy_(value)
