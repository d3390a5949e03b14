"""DENSE's data-free distillation on the server (Zhang et al., "DENSE: Data-Free One-Shot Federated
Learning", NeurIPS 2022): a generator learns images the client ensemble classifies confidently,
whose BatchNorm statistics match the teachers' and on which the student still disagrees with
the ensemble; each epoch's best batch joins an image pool, and the student is distilled from the
ensemble on the whole pool (``raysim.train.distill.kd_loss``).

The generator's loss (DENSE Eq. 4-6, the code's ``bn``, ``oh`` and ``adv`` weights):

    bn * sum over the teachers' BatchNorm layers of ||mu(x) - mu_run||_2 + ||var(x) - var_run||_2
  + oh * CE(ensemble(x), y)                                 y drawn uniformly over the classes
  + adv * -mean(1[argmax student(x) != argmax ensemble(x)] * KL(ensemble(x) || student(x)))

The last term rewards images on which the student and the ensemble disagree (DENSE's adversarial
term: synthetic data the student has not learned yet). Settled from DENSE's code where the paper
is terse: the mask is on disagreement, the generator is re-initialized (normal, std 0.02) before
every epoch's synthesis, and the BatchNorm term is the unsquared L2 norm of the moments' gaps.
Not reproduced: the code's random crop and flip of the synthetic views and of the pool's images.

Usage:
    with BatchNormStatistics(teachers) as statistics:
        images, loss = synthesize(generator, teachers, student, statistics, config, num_classes, rng)
    pool, targets = torch.cat([pool, images]), torch.cat([targets, pool_targets(teachers, images)])
    kd = distill_on_pool(student, pool, targets, optimizer, batch_size, temperature, rng)
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from raysim.train.distill import ensemble_logits, kd_loss


class SynthesisConfig(BaseModel, frozen=True, extra="forbid"):
    """DENSE's generator and its losses (the DENSE README's CIFAR-10 command unless marked)."""

    latent_dim: int = Field(256, ge=1)  # nz
    width: int = Field(64, ge=1)  # ngf
    steps: int = Field(30, ge=1)  # g_steps: generator steps per epoch
    batch_size: int = Field(256, ge=1)  # synthesis_batch_size: images per synthesized batch
    lr: float = Field(1e-3, gt=0)  # lr_g, Adam (betas 0.5, 0.999) over the generator and its z
    bn: float = Field(1.0, ge=0)  # weight of the BatchNorm-statistics loss
    oh: float = Field(1.0, ge=0)  # weight of the ensemble's cross-entropy to the drawn labels
    adv: float = Field(1.0, ge=0)  # weight of the adversarial (boundary) term


class Generator(nn.Module):
    """DENSE's DCGAN-style generator: z (B, nz) -> images (B, C, H, W), H and W multiples of 4.

    Its end is our choice: DENSE ends in a sigmoid and standardizes with the dataset's mean and
    std, which a data-free server does not know; we end as DAFL's generator does (tanh, then a
    BatchNorm without affine parameters), so images come standardized, as the models read them.
    """

    def __init__(self, latent_dim: int, width: int, image_shape: Sequence[int]) -> None:
        super().__init__()
        channels, height, breadth = (int(n) for n in image_shape)
        if height % 4 or breadth % 4:
            raise ValueError(
                f"the generator upsamples twice: image sides must be multiples of 4, got {height}x{breadth}"
            )
        self.start = (2 * width, height // 4, breadth // 4)
        self.project = nn.Linear(latent_dim, 2 * width * (height // 4) * (breadth // 4))
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * width),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * width, 2 * width, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * width, width, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.LeakyReLU(0.2),
            nn.Conv2d(width, channels, 3, stride=1, padding=1),
            nn.Tanh(),
            nn.BatchNorm2d(channels, affine=False),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.body(self.project(z).view(len(z), *self.start))


class BatchNormStatistics:
    """Forward hooks on every BatchNorm2d of ``models``: after a forward pass, ``loss()`` is the sum
    over those layers of ||batch mean - running mean||_2 + ||batch variance - running variance||_2
    of the layer's input (biased variance over batch and space; DeepInversion's feature prior,
    as DENSE uses it). A context manager: the hooks are removed on exit."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        self.layers = [m for model in models for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
        self.terms: dict[int, torch.Tensor] = {}
        self.handles = [layer.register_forward_hook(self._record) for layer in self.layers]

    def _record(self, layer: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        assert isinstance(layer, nn.BatchNorm2d) and layer.running_mean is not None
        assert layer.running_var is not None
        variance, mean = torch.var_mean(inputs[0], dim=(0, 2, 3), unbiased=False)
        self.terms[id(layer)] = torch.linalg.vector_norm(
            mean - layer.running_mean
        ) + torch.linalg.vector_norm(variance - layer.running_var)

    def loss(self) -> torch.Tensor:
        """The sum over the layers of their last forward pass's term."""
        return torch.stack([self.terms[id(layer)] for layer in self.layers]).sum()

    def __enter__(self) -> BatchNormStatistics:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for handle in self.handles:
            handle.remove()


@torch.no_grad()
def reset_generator(generator: Generator, rng: torch.Generator) -> None:
    """DENSE's re-initialization before each synthesis: conv and linear weights ~ N(0, 0.02²) with
    zero biases, BatchNorm scales ~ N(1, 0.02²) with zero shifts."""
    for module in generator.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module.weight.copy_(0.02 * torch.randn(module.weight.shape, generator=rng))
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.BatchNorm2d) and module.affine:
            module.weight.copy_(1 + 0.02 * torch.randn(module.weight.shape, generator=rng))
            module.bias.zero_()


def adversarial_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Minus the per-sample KL(softmax(teacher) || softmax(student)), averaged over the batch,
    counting only the samples where the two disagree on the class (the others count 0), as DENSE's
    code masks it (``helpers/synthesizers.py``)."""
    disagree = (student_logits.argmax(dim=1) != teacher_logits.argmax(dim=1)).float()
    divergence = F.kl_div(
        F.log_softmax(student_logits, dim=1),
        F.log_softmax(teacher_logits, dim=1),
        log_target=True,
        reduction="none",
    ).sum(dim=1)
    return -(divergence * disagree).mean()


def generator_loss(
    images: torch.Tensor,
    labels: torch.Tensor,
    teachers: Sequence[nn.Module],
    student: nn.Module,
    statistics: BatchNormStatistics,
    config: SynthesisConfig,
) -> torch.Tensor:
    """DENSE's generator loss on ``images`` (the module docstring's three terms); the teachers and
    the student are expected in eval mode (running statistics, no updates to them)."""
    teacher = ensemble_logits(teachers, images)
    loss = config.bn * statistics.loss() + config.oh * F.cross_entropy(teacher, labels)
    if config.adv > 0:
        loss = loss + config.adv * adversarial_loss(student(images), teacher)
    return loss


def synthesize(
    generator: Generator,
    teachers: Sequence[nn.Module],
    student: nn.Module,
    statistics: BatchNormStatistics,
    config: SynthesisConfig,
    num_classes: int,
    rng: torch.Generator,
) -> tuple[torch.Tensor, float]:
    """One epoch's synthesis: ``config.steps`` Adam steps on the (re-initialized) generator and a
    fresh latent batch towards ``generator_loss``; returns the batch of images whose loss was
    lowest (detached) and that loss. Gradients are taken for the generator and the latent batch
    only: the teachers' and the student's weight gradients would be work thrown away."""
    reset_generator(generator, rng)
    z = torch.randn(config.batch_size, config.latent_dim, generator=rng).requires_grad_(True)
    labels = torch.randint(num_classes, (config.batch_size,), generator=rng)
    trained = [*generator.parameters(), z]
    optimizer = torch.optim.Adam(trained, lr=config.lr, betas=(0.5, 0.999))
    for model in (*teachers, student):
        model.eval()
    generator.train()
    best_loss, best = float("inf"), torch.empty(0)
    for _ in range(config.steps):
        optimizer.zero_grad(set_to_none=True)
        images = generator(z)
        loss = generator_loss(images, labels, teachers, student, statistics, config)
        value = float(loss.detach())
        if value < best_loss:
            best_loss, best = value, images.detach().clone()
        for tensor, grad in zip(trained, torch.autograd.grad(loss, trained), strict=True):
            tensor.grad = grad
        optimizer.step()
    return best, best_loss


@torch.no_grad()
def pool_targets(teachers: Sequence[nn.Module], images: torch.Tensor) -> torch.Tensor:
    """The ensemble's logits on a batch joining the pool, computed once: the teachers are fixed
    and the pool's images are not augmented, so every later pass would compute the same."""
    for model in teachers:
        model.eval()
    return ensemble_logits(teachers, images)


def distill_on_pool(
    student: nn.Module,
    pool: torch.Tensor,
    targets: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    batch_size: int,
    temperature: float,
    rng: torch.Generator,
) -> float:
    """One pass of the student over the shuffled pool, each minibatch one step of ``kd_loss``
    towards the ensemble's logits ``targets`` (``pool_targets``, row for row); the mean loss."""
    student.train()
    order, losses = torch.randperm(len(pool), generator=rng), []
    for start in range(0, len(pool), batch_size):
        rows = order[start : start + batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = kd_loss(student(pool[rows]), targets[rows], temperature)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return sum(losses) / max(len(losses), 1)
