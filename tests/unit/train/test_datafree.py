"""DENSE's pieces (raysim.train.datafree) against hand-written references: the BatchNorm-statistics
loss, the adversarial term, the generator's images, a generator step lowering its loss, and one
pass of the student over the pool."""

import numpy as np
import pytest
import torch
from torch import nn

from raysim.train.datafree import (
    BatchNormStatistics,
    Generator,
    SynthesisConfig,
    adversarial_loss,
    distill_on_pool,
    generator_loss,
    pool_targets,
    reset_generator,
    synthesize,
)
from raysim.train.distill import ensemble_logits, kd_loss


def teacher(seed):
    """conv -> BatchNorm (eval mode, running statistics set) -> pool -> linear: (B, 1, 8, 8) -> (B, 3)."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1),
        nn.BatchNorm2d(2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2, 3),
    )
    bn = model[1]
    bn.running_mean.copy_(torch.tensor([0.3, -0.2]))
    bn.running_var.copy_(torch.tensor([0.5, 2.0]))
    return model.eval()


def test_batchnorm_statistics_loss_is_the_l2_distance_of_batch_moments_to_running_ones_summed_over_layers():
    """Per layer ||mean_bhw(h) - mu||_2 + ||var_bhw(h) - sigma²||_2 (biased variance) of the
    BatchNorm's input h, summed over every layer of every model."""
    models = [teacher(0), teacher(1)]
    x = torch.randn(5, 1, 8, 8)
    expected = 0.0
    for model in models:
        h = model[0](x).detach().numpy()  # the BatchNorm's input, (B, 2, 8, 8)
        mean, var = h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3))
        bn = model[1]
        expected += np.linalg.norm(mean - bn.running_mean.numpy()) + np.linalg.norm(
            var - bn.running_var.numpy()
        )
    with BatchNormStatistics(models) as statistics:
        for model in models:
            model(x)
        got = float(statistics.loss().detach())
    assert got == pytest.approx(expected, rel=1e-5)
    assert all(not layer._forward_hooks for model in models for layer in model.modules())  # removed on exit


def test_adversarial_term_is_minus_the_mean_kl_over_the_samples_where_student_and_ensemble_disagree():
    student = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.0, 0.1]], dtype=torch.float64)
    ensemble = torch.tensor([[1.0, 0.5, 0.0], [1.0, 0.0, 0.0], [3.0, 0.0, 1.0]], dtype=torch.float64)
    s, t = student.numpy(), ensemble.numpy()
    p_s = np.exp(s) / np.exp(s).sum(1, keepdims=True)
    p_t = np.exp(t) / np.exp(t).sum(1, keepdims=True)
    kl = np.sum(p_t * (np.log(p_t) - np.log(p_s)), axis=1)
    disagree = np.array([0.0, 1.0, 0.0])  # row 1: the student says class 1, the ensemble class 0
    assert float(adversarial_loss(student, ensemble)) == pytest.approx(-np.mean(kl * disagree), rel=1e-10)


def test_generator_makes_standardized_images_of_the_data_shape():
    generator = Generator(latent_dim=8, width=4, image_shape=(1, 8, 12))
    images = generator(torch.randn(16, 8)).detach()
    assert images.shape == (16, 1, 8, 12)
    assert float(images.mean()) == pytest.approx(0.0, abs=1e-5) and float(
        images.std(unbiased=False)
    ) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="multiples of 4"):
        Generator(latent_dim=8, width=4, image_shape=(1, 10, 8))


def test_reset_draws_dcgan_weights_from_the_generator_seed():
    """Conv and linear weights ~ N(0, 0.02²), biases 0, BatchNorm scales ~ N(1, 0.02²): the same
    seed gives the same generator, whatever it held before."""
    first, second = Generator(16, 8, (1, 8, 8)), Generator(16, 8, (1, 8, 8))
    with torch.no_grad():
        second.project.weight.add_(1.0)
    reset_generator(first, torch.Generator().manual_seed(3))
    reset_generator(second, torch.Generator().manual_seed(3))
    for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    weight = first.project.weight.detach()
    assert abs(float(weight.mean())) < 0.002 and float(weight.std()) == pytest.approx(0.02, rel=0.05)
    assert float(first.project.bias.detach().abs().max()) == 0.0
    scale = first.body[0].weight.detach()  # the first BatchNorm's
    assert float(scale.std()) == pytest.approx(0.02, rel=0.3) and float(scale.mean()) == pytest.approx(
        1.0, abs=0.01
    )


def tiny_synthesis(steps):
    teachers, student = [teacher(0), teacher(1)], teacher(2)
    torch.manual_seed(5)
    generator = Generator(latent_dim=8, width=4, image_shape=(1, 8, 8))
    config = SynthesisConfig(latent_dim=8, width=4, steps=steps, batch_size=16, lr=0.05)
    with BatchNormStatistics(teachers) as statistics:
        images, loss = synthesize(
            generator, teachers, student, statistics, config, 3, torch.Generator().manual_seed(1)
        )
    return images, loss


def test_generator_steps_decrease_its_loss_and_the_lowest_loss_batch_is_kept():
    """One step's best is the loss of the first images; twenty steps from the same generator,
    latent batch and labels end lower, and the kept batch has the reported loss."""
    _, first = tiny_synthesis(steps=1)
    images, best = tiny_synthesis(steps=20)
    assert best < 0.95 * first
    teachers, student = [teacher(0), teacher(1)], teacher(2)
    rng = torch.Generator().manual_seed(1)
    reset_generator(Generator(latent_dim=8, width=4, image_shape=(1, 8, 8)), rng)  # draws first
    torch.randn(16, 8, generator=rng)  # the latent batch, then the labels
    labels = torch.randint(3, (16,), generator=rng)
    with BatchNormStatistics(teachers) as statistics, torch.no_grad():
        again = generator_loss(
            images, labels, teachers, student, statistics, SynthesisConfig(latent_dim=8, width=4)
        )
    assert float(again) == pytest.approx(best, rel=1e-5)


def test_one_pass_over_the_pool_steps_the_student_on_the_kd_loss_to_the_ensemble():
    """A pool of one minibatch: the pass is one SGD step of kd_loss(student(x), ensemble(x))."""
    teachers, student = [teacher(0), teacher(1)], teacher(2).train()
    reference = teacher(2).train()
    pool = torch.randn(8, 1, 8, 8)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    targets = pool_targets(teachers, pool)
    loss = distill_on_pool(student, pool, targets, optimizer, 8, 3.0, torch.Generator().manual_seed(0))
    expected = kd_loss(reference(pool), ensemble_logits(teachers, pool).detach(), 3.0)
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for got, before in zip(student.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.detach(), (before - 0.1 * before.grad).detach())


def test_pool_targets_are_the_ensembles_eval_mode_logits_and_carry_no_graph():
    """Computed once per batch joining the pool: the mean of the teachers' logits with their
    running statistics (eval mode, even if a teacher was left in train mode)."""
    teachers = [teacher(0), teacher(1).train()]
    images = torch.randn(6, 1, 8, 8, requires_grad=True)
    got = pool_targets(teachers, images)
    for model in teachers:
        model.eval()
    torch.testing.assert_close(got, ensemble_logits(teachers, images).detach())
    assert not got.requires_grad


def test_synthesis_leaves_the_teachers_and_student_without_gradients():
    """The generator's steps differentiate only the generator and its latent batch: no weight
    gradient of a teacher or the student is computed (their .grad stays unset)."""
    teachers, student = [teacher(0), teacher(1)], teacher(2)
    generator = Generator(latent_dim=8, width=4, image_shape=(1, 8, 8))
    config = SynthesisConfig(latent_dim=8, width=4, steps=2, batch_size=4)
    with BatchNormStatistics(teachers) as statistics:
        synthesize(generator, teachers, student, statistics, config, 3, torch.Generator().manual_seed(1))
    assert all(p.grad is None for model in (*teachers, student) for p in model.parameters())
    assert all(p.grad is not None for p in generator.parameters())
