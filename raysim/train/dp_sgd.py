"""DP-SGD in local training: each example's gradient clipped, Gaussian noise on their sum (Abadi et
al., "Deep Learning with Differential Privacy", CCS 2016, arXiv:1607.00133).

One step of a client holding ``n`` examples, at expected batch size ``B`` and clip bound ``C``:

    batch  = {i : u_i < q},  u_i ~ U[0, 1) from the client's seeded generator,  q = min(1, B / n)
    g_i    = the gradient of example i's task loss alone, over the trainable parameters
    g      = (sum_i g_i min(1, C / ||g_i||) + N(0, (noise_multiplier C)^2 I)) / B
    p.grad = g     then the plugin's gradient edit, its watch, grad_clip and the optimizer's step

``||g_i||`` is the L2 norm over all trainable parameters at once. The batch is a Poisson sample, as
the accountant assumes (``raysim.privacy.per_client.sample_epsilon``), and the sum is divided by
the expected ``B``, never by the drawn batch's size, which would leak it. An epoch is still
``ceil(n / B)`` steps. Each step is then a sampled Gaussian mechanism on the client's examples
(add or remove one), and whatever follows from ``g`` is post-processing: the optimizer's moments,
a plugin's gradient edit (FedProx's proximal term, SCAFFOLD's correction), the delta, the server.
Not covered: the client's weight (its example count) and train metrics, which the simulation
reports as they are.

The law needs three things of local training; each is refused, with one error naming the fix,
where it does not hold:

- a loss of one example alone: the task loss (``raysim.train.task_loss``). A plugin's ``loss_fn``
  or ``extra_loss``, or a pass at other weights, may read other examples (label counts, a batch's
  features) and is refused.
- one noised gradient per sampled batch: a step taking two (SAM's ascent and descent, a pass per
  anchor) would spend twice what the accountant counts.
- no batch statistics: BatchNorm in train mode mixes a batch's examples, so an example's gradient
  is not its own.

Per-example gradients come from ``torch.func``: ``vmap`` over the batch of ``grad`` of one
example's loss through ``functional_call`` over the trainable parameters; buffers and frozen
parameters are the model's own, and dropout draws its own mask per example. They take ``B`` times
the trainable parameters' memory. The noise is drawn on the model's device from a generator seeded
by the client's seed, apart from its shuffling and dropout streams.

Usage:
    metrics = train_local(model, data, config, seed=7, spec=spec, sample_privacy=ctx.sample_privacy)
    grads, (loss, correct, count) = per_example_gradients(model, batch, spec)   # each (B, *shape)
    summed = clipped_sum(grads, clip_bound=1.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn
from torch.func import grad, vmap

from raysim import params as P
from raysim.config.privacy import SamplePrivacy
from raysim.errors import ConfigError
from raysim.train.client_change import BatchLoss, Pass, Weights, task_pass
from raysim.train.task_loss import task_loss
from raysim.types import DataSpec

Batch = dict[str, torch.Tensor]
_NOISE_STREAM = 0xD95  # the spawn key of the noise's seed sequence: no other stream has one


def batch_statistics_problem(model: nn.Module) -> str | None:
    """Why ``model`` cannot train with DP-SGD: the first BatchNorm that normalises with batch
    statistics (train mode), named with the fix; None when there is none."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            return (
                f"privacy.sample: the model's {name!r} ({type(module).__name__}) normalises with batch "
                "statistics while training, which mix a batch's examples, so one example's gradient is "
                "not its own: use a model with GroupNorm or LayerNorm instead (e.g. norm: group), or "
                "drop privacy.sample"
            )
    return None


def poisson_batches(
    tensors: Batch, batch_size: int, generator: torch.Generator, num_steps: int | None = None
) -> Iterator[Batch]:
    """One epoch of Poisson-sampled batches: each of ``ceil(n / batch_size)`` steps (or
    ``num_steps``) takes every example independently with probability ``min(1, batch_size / n)``,
    drawn on the CPU from ``generator``; a batch may be empty."""
    first = next(iter(tensors.values()))
    n = len(first)
    q = min(1.0, batch_size / n) if n else 0.0
    for _ in range(math.ceil(n / batch_size) if num_steps is None else num_steps):
        idx = (torch.rand(n, generator=generator) < q).nonzero().squeeze(1).to(first.device)
        yield {k: v[idx] for k, v in tensors.items()}


def per_example_gradients(
    model: nn.Module, batch: Batch, spec: DataSpec
) -> tuple[Weights, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each example's gradient of its own task loss over ``model``'s trainable parameters, and
    each example's (loss, #correct, #predictions), all along a leading batch axis (B, ...)."""
    weights = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}

    def example_loss(at: Weights, example: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        one = {k: v.unsqueeze(0) for k, v in example.items()}  # a batch of one: (1, ...)
        loss, correct, count = task_loss(P.at_weights(model, at), one, spec)
        device = loss.device
        return loss, (
            loss.detach(),
            torch.as_tensor(correct, device=device),
            torch.as_tensor(count, device=device),
        )

    # randomness "different": each example draws its own dropout mask, as in a batch
    grads, losses = vmap(grad(example_loss, has_aux=True), in_dims=(None, 0), randomness="different")(
        weights, batch
    )
    return grads, losses


def clipped_sum(grads: Weights, clip_bound: float) -> Weights:
    """The sum over the batch axis of the gradients, each scaled to L2 norm at most
    ``clip_bound`` over all of its tensors at once (Opacus's factor, ``C / (norm + 1e-6)``)."""
    squares = [g.flatten(1).float().pow(2).sum(1) for g in grads.values()]  # (B,) each
    norms = torch.stack(squares).sum(0).sqrt()
    factor = (clip_bound / (norms + 1e-6)).clamp(max=1.0)
    return {name: torch.einsum("b,b...->...", factor.to(g.dtype), g) for name, g in grads.items()}


def private_gradient_(
    model: nn.Module,
    batch: Batch,
    spec: DataSpec,
    *,
    clip_bound: float,
    noise_multiplier: float,
    expected_batch_size: float,
    generator: torch.Generator,
) -> BatchLoss:
    """Writes DP-SGD's gradient (the module's law) into the trainable parameters' ``.grad``.

    ``noise_multiplier`` may be 0 here (no noise: a test's exact clipped mean); the job's
    ``privacy.sample`` requires more. ``generator`` lives on the parameters' device.

    Returns:
        The batch's mean task loss, #correct and #predictions, for the metrics (0s when empty).
    """
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    anchor = next(iter(params.values()))
    if len(next(iter(batch.values()))) == 0:  # Poisson drew no example: the noise alone
        sums = {name: torch.zeros_like(p) for name, p in params.items()}
        zero = torch.zeros((), device=anchor.device)
        losses: BatchLoss = (zero, zero, zero)
    else:
        grads, (loss, correct, count) = per_example_gradients(model, batch, spec)
        sums = clipped_sum(grads, clip_bound)
        counts = count.to(loss.dtype)
        losses = ((loss * counts).sum() / counts.sum().clamp(min=1), correct.sum(), count.sum())
    std = noise_multiplier * clip_bound
    for name, p in params.items():
        noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype) * std
        p.grad = (sums[name].to(p.dtype) + noise) / expected_batch_size
    return losses


class DpSgd:
    """One client's DP-SGD in ``train_local``: its Poisson batches and its private backward.

    Built once per client: it refuses BatchNorm in train mode, and seeds the noise from the
    client's ``seed``. ``batches`` replaces ``iterate_batches``; ``backward`` replaces the loss's
    backward pass, and refuses a second gradient of one sampled batch.
    """

    def __init__(
        self, config: SamplePrivacy, model: nn.Module, spec: DataSpec, seed: int, batch_size: int
    ) -> None:
        if (problem := batch_statistics_problem(model)) is not None:
            raise ConfigError([problem])
        self.config, self.spec, self.batch_size = config, spec, batch_size
        device = next(model.parameters()).device
        self.generator = torch.Generator(device=device).manual_seed(noise_stream_seed(seed))
        self._gradients_of_batch = 0

    def batches(self, tensors: Batch, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        """One epoch of Poisson batches (``poisson_batches``), as ``iterate_batches``' signature."""
        for batch in poisson_batches(tensors, batch_size, generator):
            self._gradients_of_batch = 0
            yield batch

    def backward(
        self,
        model: nn.Module,
        batch: Batch,
        one_pass: Pass,
        loss_fn: Callable[..., BatchLoss] | None,
        extra_loss: object,
    ) -> BatchLoss:
        """``private_gradient_`` on ``batch``, after refusing what the law cannot take."""
        if loss_fn is not None or extra_loss is not None or one_pass is not task_pass:
            raise ConfigError(
                [
                    "privacy.sample: DP-SGD clips each example's gradient of the task loss, and this "
                    "plugin trains on its own loss (a loss_fn, an extra_loss or a pass at other "
                    "weights), which may read other examples: use a plugin that trains on the task "
                    "loss (fedavg, fedprox, scaffold, ...), or drop privacy.sample"
                ]
            )
        self._gradients_of_batch += 1
        if self._gradients_of_batch > 1:
            raise ConfigError(
                [
                    "privacy.sample: the plugin took a second gradient of one sampled batch (SAM's "
                    "ascent and descent, a step per pass); the accountant counts one noised gradient "
                    "per batch: use a plugin that steps once per batch, or drop privacy.sample"
                ]
            )
        return private_gradient_(
            model,
            batch,
            self.spec,
            clip_bound=self.config.clip_bound,
            noise_multiplier=self.config.noise_multiplier,
            expected_batch_size=self.batch_size,
            generator=self.generator,
        )


def noise_stream_seed(seed: int) -> int:
    """The seed of a client's DP-SGD noise, derived from its ``seed`` apart from every other stream."""
    state = np.random.SeedSequence(seed, spawn_key=(_NOISE_STREAM,)).generate_state(2)
    return int((int(state[0]) << 31 ^ int(state[1])) & (2**63 - 1))
