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
through ``train_local``'s ``backward``, both passes include ``extra_loss``, the change's ``edit`` and
``watch`` and clipping (a global clip rescales g, which leaves ``e`` unchanged).

Plugins take SAM's settings as one ``sam: SamConfig`` option (``sam: {rho: 0.05}``; ASAM:
``sam: {rho: 0.5, adaptive: true, eta: 0.01}``), None (``sam: null``) where SAM is optional.

Usage:
    metrics = train_local(model, data, config, seed=s, spec=spec, hooks=LocalHooks(step=sam_step(rho=0.05)))
    delta, metrics = train_client(ctx, config, LocalHooks(step=sam_step(rho=0.5, adaptive=True)))  # ASAM
    delta, metrics = train_client(ctx, config, LocalHooks(step=sam_step(**config.sam.model_dump())))
    loss = sam_descend(model, batch, optimizer, backward, config.sam, loss_fn)  # inside a LocalStep
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from pydantic import BaseModel, Field, model_validator
from torch import nn

from raysim.train.batching import Batch
from raysim.train.local import Backward, BatchLoss, LocalStep, LossFn

_TINY = 1e-16  # keeps e finite (zero) when the gradient is zero


_SAM_ETA = 0.01  # ASAM's eta by default (the authors' code)


class SamConfig(BaseModel, frozen=True, extra="forbid"):
    """SAM's settings, the same in every plugin that offers SAM: the radius ``rho``, and with
    ``adaptive`` ASAM's scale-invariant neighbourhood with offset ``eta`` (``T_w = |w| + eta``)."""

    rho: float = Field(0.05, ge=0)  # SAM's usual radius; ASAM's authors use 0.5
    adaptive: bool = False
    eta: float = Field(_SAM_ETA, ge=0)  # ASAM only

    @model_validator(mode="after")
    def _eta_is_asams(self) -> SamConfig:
        if not self.adaptive and self.eta != _SAM_ETA:
            raise ValueError("eta is ASAM's offset and does nothing in SAM: set adaptive: true, or drop eta")
        return self


def sam_step(rho: float = 0.05, adaptive: bool = False, *, eta: float = _SAM_ETA) -> LocalStep:
    """A ``LocalStep`` taking SAM's (or, with ``adaptive``, ASAM's) update on every batch.

    Args:
        rho: radius of the neighbourhood; 0 gives the plain gradient step at twice the cost.
        adaptive: ASAM's scale-invariant neighbourhood instead of SAM's ball.
        eta: ASAM's offset in ``T_w = |w| + eta``; SAM refuses any other than the default.

    Raises:
        ValueError: ``rho`` or ``eta`` is negative, or ``eta`` is set without ``adaptive``
            (``SamConfig``'s checks).
    """
    sam = SamConfig(rho=rho, adaptive=adaptive, eta=eta)

    def step(
        model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, backward: Backward
    ) -> BatchLoss:
        return sam_descend(model, batch, optimizer, backward, sam)

    return step


def sam_descend(
    model: nn.Module,
    batch: Batch,
    optimizer: torch.optim.Optimizer,
    backward: Backward,
    sam: SamConfig | None,
    loss_fn: LossFn | None = None,
    *,
    add_clean_gradient: bool = False,
) -> BatchLoss:
    """One optimizer step on ``loss_fn`` (the trainer's task loss when None) with the gradient
    taken at SAM's (ASAM's) perturbed point, or a plain gradient step when ``sam`` is None: the
    body of ``sam_step``, for ``LocalStep``s that take several steps per batch (FedGuCci+'s task
    step and connectivity steps).

    ``add_clean_gradient`` steps on the clean plus the perturbed gradient instead: the FedGuCci
    code's SAM connectivity step (Li et al., KDD 2025, arXiv:2402.18949).
    Returns the loss at the weights the step started from.
    """
    loss = backward(batch, loss_fn)  # grad L(w)
    if sam is None:
        optimizer.step()
        return loss
    clean = (
        {p: p.grad.clone() for p in model.parameters() if p.grad is not None} if add_clean_gradient else {}
    )
    with sam_perturbation(model, sam.rho, sam.adaptive, eta=sam.eta):
        backward(batch, loss_fn)  # grad L(w + e), left in .grad after the weights return to w
    for p, g in clean.items():
        if p.grad is not None:
            p.grad.add_(g)
    optimizer.step()
    return loss


@contextlib.contextmanager
def sam_perturbation(
    model: nn.Module, rho: float, adaptive: bool = False, *, eta: float = _SAM_ETA
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
