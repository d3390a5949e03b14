"""DP-SGD in local training: each example's gradient clipped, Gaussian noise on their sum (Abadi et
al., "Deep Learning with Differential Privacy", CCS 2016, arXiv:1607.00133).

One step of a client holding ``n`` examples, at expected batch size ``B`` and clip bound ``C``:

    batch  = {i : u_i < q},  u_i ~ U[0, 1) from the client's seeded generator,  q = min(1, B / n)
    g_i    = the gradient of example i's task loss alone, over the trainable parameters
    g      = (sum_i g_i min(1, C / ||g_i||) + N(0, (noise_multiplier C)^2 I)) / B
    p.grad = g     then the plugin's gradient edit, its watch, grad_clip and the optimizer's step

``||g_i||`` is the L2 norm over all trainable parameters at once (``raysim.params.tree_norm``). The
batch is a Poisson sample, as the accountant assumes (``raysim.privacy.per_client.sample_epsilon``),
and the sum is divided by the expected ``B``, never by the drawn batch's size, which would leak it.
An epoch is still ``ceil(n / B)`` steps. ``n`` is the data the training is given (after
``engine.max_client_examples`` and the validation split), and each training reports its ``n``,
``B`` and noised steps among its metrics (``privacy/sample/examples``, ``.../batch_size``,
``.../steps``): the accountant composes what ran, never what the store holds. Each step is then a
sampled Gaussian mechanism on the client's examples (add or remove one), and whatever follows from
``g`` is post-processing: the optimizer's moments, a plugin's gradient edit (FedProx's proximal
term, SCAFFOLD's correction), the delta, the server.
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
by ``raysim.sampling.noise_seed`` of the client's seed, round and id (its caller's), apart from its
shuffling and dropout streams and from local DP's noise.

Usage:
    private = SampleNoise(privacy, noise_seed(ctx.seed, ctx.round_num, ctx.client_id))
    metrics = train_local(model, data, config, seed=7, spec=spec, sample_privacy=private)
    grads, (loss, correct, count) = per_example_gradients(model, batch, spec)   # each (B, *shape)
    summed = clipped_sum(grads, clip_bound=1.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.func import grad, vmap

from raysim import params as P
from raysim.config.privacy import SamplePrivacy
from raysim.errors import ConfigError
from raysim.train.at_weights import at_weights
from raysim.train.client_change import BatchLoss, Pass, Weights, task_pass
from raysim.train.task_loss import task_loss
from raysim.types import DataSpec

Batch = dict[str, torch.Tensor]
# a client's DP-SGD counts among its metrics, one training's each (``DpSgd.metrics``)
EXAMPLES_METRIC = "privacy/sample/examples"  # the population its Poisson batches are drawn from
BATCH_METRIC = "privacy/sample/batch_size"  # the expected batch: the rate is batch_size / examples
STEPS_METRIC = "privacy/sample/steps"  # the noised gradients it released


class Batching(Protocol):
    """What DP-SGD reads of the local training config (``LocalTrainConfig``): its expected batch."""

    @property
    def batch_size(self) -> int: ...


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
        loss, correct, count = task_loss(at_weights(model, at), one, spec)
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
    """The sum over the batch axis of the gradients, each scaled by ``raysim.params.clip_factor``
    to L2 norm at most ``clip_bound`` over all of its tensors at once (``tree_norm``)."""
    norms = vmap(P.tree_norm)(grads)  # (B,) float64: each example's norm over every tensor
    factor = P.clip_factor(norms, clip_bound)
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


@dataclass(frozen=True)
class SampleNoise:
    """DP-SGD for one client's training: the job's ``privacy.sample`` and its noise's seed
    (``raysim.sampling.noise_seed``), which always travel together."""

    config: SamplePrivacy
    seed: int


class DpSgd:
    """One client's DP-SGD in ``train_local``: its Poisson batches, its private backward, and the
    counts its accounting needs.

    Built once per ``train_local``: it refuses BatchNorm in train mode and seeds the noise from
    ``noise_seed`` (``raysim.sampling.noise_seed``, given by the caller). ``batches`` replaces
    ``iterate_batches``; ``backward`` replaces the loss's backward pass, and refuses a second
    gradient of one sampled batch. ``metrics`` reports what it ran: the examples it sampled from,
    the expected batch, and the noised steps (``raysim.privacy.client_counts`` composes them).
    """

    def __init__(
        self, config: SamplePrivacy, model: nn.Module, spec: DataSpec, noise_seed: int, batch_size: int
    ) -> None:
        if (problem := batch_statistics_problem(model)) is not None:
            raise ConfigError([problem])
        self.config, self.spec, self.batch_size = config, spec, batch_size
        device = next(model.parameters()).device
        self.generator = torch.Generator(device=device).manual_seed(noise_seed)
        self.num_examples: int | None = None  # the population its batches are drawn from
        self.num_steps = 0  # noised gradients released
        self._gradients_of_batch = 0

    @classmethod
    def of(cls, private: SampleNoise, model: nn.Module, spec: DataSpec, local: Batching) -> DpSgd:
        """``train_local``'s DP-SGD at ``local.batch_size``."""
        return cls(private.config, model, spec, private.seed, local.batch_size)

    def batches(self, tensors: Batch, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        """One epoch of Poisson batches (``poisson_batches``), as ``iterate_batches``' signature."""
        n = len(next(iter(tensors.values())))
        if self.num_examples is not None and n != self.num_examples:
            # one rate per training: another population would need an event of its own
            raise ValueError(
                f"DP-SGD drew from {self.num_examples} examples, then {n}: train each population "
                "with its own train_local call, whose metrics count it apart"
            )
        self.num_examples = n
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
        self.num_steps += 1
        return private_gradient_(
            model,
            batch,
            self.spec,
            clip_bound=self.config.clip_bound,
            noise_multiplier=self.config.noise_multiplier,
            expected_batch_size=self.batch_size,
            generator=self.generator,
        )

    def metrics(self) -> dict[str, float]:
        """What this training spent: ``sample_counts`` of its population, batch and noised steps."""
        return sample_counts(self.num_examples or 0, self.batch_size, self.num_steps)


def sample_counts(num_examples: int, batch_size: int, num_steps: int) -> dict[str, float]:
    """A client's DP-SGD counts as its metrics: each of ``num_steps`` noised gradients drew a
    Poisson batch of expected size ``batch_size`` from ``num_examples`` examples. A client that
    trains nothing in a round under DP-SGD (a recall of its kept model) reports 0 steps."""
    return {
        EXAMPLES_METRIC: float(num_examples),
        BATCH_METRIC: float(batch_size),
        STEPS_METRIC: float(num_steps),
    }
