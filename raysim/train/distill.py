"""Knowledge distillation of an ensemble of client models into one student model, on the server
(FedDF's transfer set, DENSE's synthetic image pool).

The teachers are the one-shot client models; the ensemble's output is the mean of their raw logits
(FedDF's AVGLOGITS, DENSE's ensemble). The student learns the ensemble's softened outputs by
``kd_loss`` (Hinton et al., 2015). ``distill_on_set`` is FedDF's server loop: Adam with cosine
annealing over a fixed number of steps on minibatches of the transfer set, early stopped on a
labelled validation set (the best student so far is kept, training ends after ``patience`` steps
without a better one).

Usage:
    teacher = ensemble_logits(teachers, x)  # (B, C)
    loss = kd_loss(student(x), teacher, temperature=1.0)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) averaged over the batch, times T² so that
    the gradient's scale does not shrink with T (Hinton et al., 2015)."""
    student = F.log_softmax(student_logits / temperature, dim=1)
    teacher = F.log_softmax(teacher_logits / temperature, dim=1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean") * temperature**2


def ensemble_logits(teachers: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """The mean of the teachers' raw logits, (B, C); gradients flow to ``x`` when it needs them."""
    return torch.stack([teacher(x) for teacher in teachers]).mean(dim=0)


class DistillConfig(BaseModel, frozen=True, extra="forbid"):
    """FedDF's server-side distillation (Lin et al., 2020, section 4 and appendix A)."""

    steps: int = Field(10_000, ge=1)  # the paper's N = 10^4 server steps at most
    patience: int = Field(1_000, ge=1)  # steps without a better validation accuracy before stopping
    eval_every: int = Field(100, ge=1)  # steps between validation checks (our choice)
    batch_size: int = Field(128, ge=1)  # our choice; the paper does not fix it in the text we have
    lr: float = Field(1e-3, gt=0)  # Adam, annealed by a cosine to 0 over ``steps``
    temperature: float = Field(1.0, gt=0)  # KL on the averaged logits at T = 1 (our reading)


@dataclass(frozen=True)
class DistillReport:
    """What a distillation did: steps taken, the step of the kept (best) student, its validation
    accuracy (NaN without a validation set) and the last minibatch's KD loss."""

    steps: int
    best_step: int
    best_accuracy: float
    last_loss: float


def distill_on_set(
    student: nn.Module,
    inputs: torch.Tensor,
    teacher_logits: torch.Tensor,
    validation: tuple[torch.Tensor, torch.Tensor] | None,
    config: DistillConfig,
    generator: torch.Generator,
) -> DistillReport:
    """Trains ``student`` in place towards ``teacher_logits`` on ``inputs`` (its rows), with
    minibatches drawn by ``generator``; with ``validation`` (x, y) the student that scores best
    there is kept and training stops after ``config.patience`` steps without improvement."""
    optimizer = torch.optim.Adam(student.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.steps)
    best_accuracy, best_step = accuracy(student, validation), 0
    best_state = copy.deepcopy(student.state_dict())
    loss, step = math.nan, 0
    for step in range(1, config.steps + 1):
        rows = torch.randint(len(inputs), (min(config.batch_size, len(inputs)),), generator=generator)
        loss = distill_step(student, optimizer, inputs[rows], teacher_logits[rows], config.temperature)
        schedule.step()
        if validation is not None and (step % config.eval_every == 0 or step == config.steps):
            score = accuracy(student, validation)
            if score > best_accuracy:
                best_accuracy, best_step, best_state = score, step, copy.deepcopy(student.state_dict())
            elif step - best_step >= config.patience:
                break
    if validation is not None:
        student.load_state_dict(best_state)
    return DistillReport(step, best_step if validation is not None else step, best_accuracy, loss)


def distill_step(
    student: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float,
) -> float:
    """One optimizer step of ``student`` on ``kd_loss`` towards ``teacher_logits``; the loss."""
    student.train()
    optimizer.zero_grad(set_to_none=True)
    loss = kd_loss(student(x), teacher_logits.detach(), temperature)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def accuracy(
    model: nn.Module, data: tuple[torch.Tensor, torch.Tensor] | None, batch_size: int = 512
) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on (x, y); NaN without data. Leaves it in train mode."""
    if data is None:
        return math.nan
    x, y = data
    model.eval()
    correct = sum(
        int((model(x[i : i + batch_size]).argmax(dim=1) == y[i : i + batch_size]).sum())
        for i in range(0, len(x), batch_size)
    )
    model.train()
    return correct / max(len(x), 1)
