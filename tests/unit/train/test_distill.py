"""Ensemble distillation (raysim.train.distill) against hand-written numpy: the KD loss, one
distillation step of a linear student, FedDF's early stopping and its kept best student."""

import numpy as np
import pytest
import torch
from torch import nn

from raysim.train.distill import DistillConfig, distill_on_set, distill_step, ensemble_logits, kd_loss

RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, 3))
STUDENT_LOGITS = RNG.normal(size=(6, 4))
TEACHER_LOGITS = 2 * RNG.normal(size=(6, 4))


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_kd_loss_is_the_batch_mean_kl_of_the_softened_teacher_to_the_student_times_t_squared(temperature):
    """sum_c p_t (log p_t - log p_s) averaged over rows, p = softmax(logits / T), times T²."""
    p_t, p_s = softmax(TEACHER_LOGITS / temperature), softmax(STUDENT_LOGITS / temperature)
    expected = temperature**2 * np.mean(np.sum(p_t * (np.log(p_t) - np.log(p_s)), axis=1))
    got = kd_loss(torch.tensor(STUDENT_LOGITS), torch.tensor(TEACHER_LOGITS), temperature)
    assert float(got) == pytest.approx(expected, rel=1e-10)


def test_the_ensemble_is_the_mean_of_raw_logits_not_of_probabilities():
    teachers = [nn.Linear(3, 4).double() for _ in range(3)]
    x = torch.tensor(X)
    expected = np.mean(
        [(X @ t.weight.detach().numpy().T + t.bias.detach().numpy()) for t in teachers], axis=0
    )
    np.testing.assert_allclose(ensemble_logits(teachers, x).detach().numpy(), expected, rtol=1e-12)


def test_one_distillation_step_moves_a_linear_student_by_the_hand_derived_gradient():
    """d(kd_loss)/d(logits) = T (softmax(s / T) - softmax(t / T)) / B, so for logits = x W^T + b
    the SGD step is W -= lr G^T x, b -= lr sum_rows G with G that matrix."""
    temperature, lr = 2.0, 0.3
    student = nn.Linear(3, 4).double()
    w0, b0 = student.weight.detach().numpy().copy(), student.bias.detach().numpy().copy()
    optimizer = torch.optim.SGD(student.parameters(), lr=lr)
    distill_step(student, optimizer, torch.tensor(X), torch.tensor(TEACHER_LOGITS), temperature)
    logits = X @ w0.T + b0
    g = temperature * (softmax(logits / temperature) - softmax(TEACHER_LOGITS / temperature)) / len(X)
    np.testing.assert_allclose(student.weight.detach().numpy(), w0 - lr * g.T @ X, rtol=1e-10)
    np.testing.assert_allclose(student.bias.detach().numpy(), b0 - lr * g.sum(axis=0), rtol=1e-10)


def linear_task():
    """A teacher's logits on 200 points and a student that starts at another linear map."""
    torch.manual_seed(0)
    x = torch.randn(200, 3, dtype=torch.float64)
    teacher = nn.Linear(3, 4).double()
    with torch.no_grad():
        teacher.weight.mul_(5.0)
        logits = teacher(x)
    return x, logits, logits.argmax(dim=1), nn.Linear(3, 4).double()


def test_distillation_raises_the_validation_accuracy_towards_the_teachers():
    x, logits, labels, student = linear_task()
    before = float((student(x).argmax(dim=1) == labels).double().mean())
    config = DistillConfig(steps=300, patience=300, eval_every=10, batch_size=32, lr=0.05)
    report = distill_on_set(
        student, x[:150], logits[:150], (x[150:], labels[150:]), config, torch.Generator().manual_seed(0)
    )
    after = float((student(x[150:]).argmax(dim=1) == labels[150:]).double().mean())
    assert before < 0.8 and after > 0.9 and report.best_accuracy == pytest.approx(after)


def test_early_stopping_ends_after_patience_without_a_better_student_and_keeps_the_best():
    """A validation set the initial student already classifies perfectly: no step can beat it, so
    training stops at the first check ``patience`` steps after step 0 and the initial student is
    restored exactly."""
    x, logits, _, student = linear_task()
    own_labels = student(x).argmax(dim=1).detach()  # the student's own predictions: accuracy 1
    initial = {k: v.clone() for k, v in student.state_dict().items()}
    config = DistillConfig(steps=1000, patience=40, eval_every=10, batch_size=32, lr=0.05)
    report = distill_on_set(student, x, logits, (x, own_labels), config, torch.Generator().manual_seed(0))
    assert (report.steps, report.best_step, report.best_accuracy) == (40, 0, 1.0)
    for name, value in student.state_dict().items():
        assert torch.equal(value, initial[name])


def test_without_validation_every_step_runs_and_the_last_student_is_kept():
    x, logits, _, student = linear_task()
    config = DistillConfig(steps=25, patience=1, eval_every=1, batch_size=32, lr=0.05)
    report = distill_on_set(student, x, logits, None, config, torch.Generator().manual_seed(0))
    assert report.steps == 25 and report.best_step == 25 and np.isnan(report.best_accuracy)
