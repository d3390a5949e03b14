"""DP-SGD in the shared trainer: per-example gradients clipped and summed as a plain loop of
single-example backward passes would, Gaussian noise of std ``noise_multiplier * clip_bound`` over
the expected batch size, seeded by the caller's noise seed, Poisson batches, the counts each
training reports for its accounting, and refusals where the law cannot hold.

The reference for the clipped sum is written out here with plain autograd: for each example alone
``loss.backward()``, ``torch.nn.utils.clip_grad_norm_`` to the bound (the same ``C / (norm + 1e-6)``
factor), then the sum. The noise check compares the sample standard deviation of N draws with its
law, whose standard error is about s / sqrt(2N); five standard errors are allowed."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from raysim import params as P
from raysim.config.privacy import SamplePrivacy
from raysim.errors import ConfigError
from raysim.sampling import noise_seed
from raysim.train.dp_sgd import DpSgd, SampleNoise, poisson_batches, private_gradient_
from raysim.train.local import LocalHooks, LocalTrainConfig, train_context, train_local
from raysim.train.task_loss import task_loss
from raysim.types import ClientContext, ClientData, DataSpec, Payload

SPEC = DataSpec("classification", (1, 6, 6), 3)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 8), nn.Tanh(), nn.Linear(8, 3))


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
    )


def batch_of(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 1, 6, 6, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}


def loop_clipped_sum(
    model: nn.Module, batch: dict[str, torch.Tensor], bound: float
) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    total = {k: torch.zeros_like(p) for k, p in params.items()}
    for i in range(len(batch["y"])):
        model.zero_grad(set_to_none=True)
        task_loss(model, {k: v[i : i + 1] for k, v in batch.items()}, SPEC)[0].backward()
        nn.utils.clip_grad_norm_(model.parameters(), bound)
        for k, p in params.items():
            total[k] += p.grad
    model.zero_grad(set_to_none=True)
    return total


def example_norms(model: nn.Module, batch: dict[str, torch.Tensor]) -> list[float]:
    norms = []
    for i in range(len(batch["y"])):
        model.zero_grad(set_to_none=True)
        task_loss(model, {k: v[i : i + 1] for k, v in batch.items()}, SPEC)[0].backward()
        norms.append(math.sqrt(sum(float((p.grad**2).sum()) for p in model.parameters())))
    return norms


@pytest.mark.parametrize("build", [mlp, conv_net])
def test_the_clipped_sum_equals_a_loop_of_single_example_backward_passes(build):
    torch.manual_seed(0)
    model, batch = build(), batch_of(12)
    bound = float(np.median(example_norms(model, batch)))  # half the examples clipped, half not
    expected = loop_clipped_sum(model, batch, bound)
    loss, correct, count = private_gradient_(
        model,
        batch,
        SPEC,
        clip_bound=bound,
        noise_multiplier=0.0,
        expected_batch_size=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-4, atol=1e-6), name
    with torch.no_grad():
        logits = model(batch["x"])
    assert float(loss) == pytest.approx(float(nn.functional.cross_entropy(logits, batch["y"])), rel=1e-5)
    assert int(correct) == int((logits.argmax(-1) == batch["y"]).sum()) and int(count) == 12


def test_the_noise_has_std_noise_multiplier_times_bound_over_the_expected_batch():
    model = nn.Linear(200, 100)  # 20,100 coordinates
    empty = {"x": torch.zeros(0, 200), "y": torch.zeros(0, dtype=torch.int64)}  # Poisson drew none
    private_gradient_(
        model,
        empty,
        DataSpec("classification", (200,), 100),
        clip_bound=0.5,
        noise_multiplier=2.0,
        expected_batch_size=4.0,
        generator=torch.Generator().manual_seed(3),
    )
    noise = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
    expected, n = 2.0 * 0.5 / 4.0, noise.numel()
    assert float(noise.std()) == pytest.approx(expected, abs=5 * expected / math.sqrt(2 * n))
    assert abs(float(noise.mean())) < 5 * expected / math.sqrt(n)


def test_poisson_batches_take_each_example_with_probability_batch_over_n():
    n, batch_size, epochs = 205, 20, 60
    tensors = {"i": torch.arange(n)}
    generator = torch.Generator().manual_seed(0)
    batches = [b["i"] for _ in range(epochs) for b in poisson_batches(tensors, batch_size, generator)]
    assert len(batches) == epochs * math.ceil(n / batch_size)  # 11 steps an epoch, as plain SGD
    sizes = torch.tensor([len(b) for b in batches], dtype=torch.float64)
    q = batch_size / n
    standard_error = math.sqrt(n * q * (1 - q) / len(batches))
    assert float(sizes.mean()) == pytest.approx(batch_size, abs=5 * standard_error)
    assert float(sizes.var()) == pytest.approx(n * q * (1 - q), rel=0.2)  # binomial, not fixed
    taken = torch.zeros(n)
    for b in batches:
        taken[b] += 1
    assert float(taken.mean()) / len(batches) == pytest.approx(q, rel=0.02)


def client_data(n: int = 40) -> ClientData:
    batch = batch_of(n, seed=1)
    return ClientData({"x": batch["x"].numpy(), "y": batch["y"].numpy()})


PRIVACY = SamplePrivacy(clip_bound=1.0, noise_multiplier=1.0)


def train(model: nn.Module, seed: int = 5, data: ClientData | None = None, **kwargs) -> dict:
    config = kwargs.pop("config", LocalTrainConfig(epochs=2, batch_size=8, lr=0.1))
    return train_local(
        model,
        data or client_data(),
        config,
        seed=seed,
        spec=SPEC,
        sample_privacy=SampleNoise(PRIVACY, kwargs.pop("noise_seed", noise_seed(seed, 0, 0))),
        **kwargs,
    )


def test_batchnorm_in_train_mode_is_refused_naming_the_module_and_the_fix():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 3))
    with pytest.raises(ConfigError, match=r"'1' \(BatchNorm2d\).*GroupNorm or LayerNorm.*privacy.sample"):
        train(model)


def test_a_loss_of_the_plugins_own_or_a_second_gradient_of_a_batch_is_refused():
    with pytest.raises(ConfigError, match="its own loss"):
        train(mlp(), hooks=LocalHooks(loss_fn=task_loss))

    def twice(model, batch, optimizer, backward):  # SAM's shape: two gradients, one batch
        backward(batch)
        loss = backward(batch)
        optimizer.step()
        return loss

    with pytest.raises(ConfigError, match="second gradient of one sampled batch"):
        train(mlp(), hooks=LocalHooks(step=twice))


def test_private_training_is_a_pure_function_of_the_seed_and_counts_every_example():
    torch.manual_seed(0)
    start = mlp().state_dict()
    models = [mlp() for _ in range(3)]
    for model in models:
        model.load_state_dict(start)
    metrics = [train(models[0]), train(models[1]), train(models[2], seed=6)]
    same = [torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True)]
    assert all(same)
    assert not torch.allclose(next(models[0].parameters()), next(models[2].parameters()))
    assert metrics[0]["train/steps"] == 2 * math.ceil(40 / 8) and metrics[0]["train/num_examples"] == 40


def trained(seed: int, noise: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = mlp()
    train(model, seed=seed, noise_seed=noise)
    return list(model.parameters())


def test_the_noise_follows_the_noise_seed_its_caller_passes():
    same = trained(5, noise=11)
    assert all(torch.equal(a, b) for a, b in zip(same, trained(5, noise=11), strict=True))
    # the same batches (shuffling seed 5), other noise: another model
    assert not torch.allclose(same[0], trained(5, noise=12)[0])


def test_train_context_seeds_the_noise_by_the_clients_seed_round_and_id():
    """``noise_seed(ctx.seed, ctx.round_num, ctx.client_id)``: a client's plugin-side training
    equals train_local given that seed, and another round or client draws other noise."""

    def context(net: nn.Module, round_num: int, client_id: int) -> ClientContext:
        return ClientContext(
            client_id=client_id,
            round_num=round_num,
            model=net,
            payload=Payload({}),
            global_params=P.clone(P.model_params(net)),
            data=client_data(),
            state=None,
            seed=5,
            device=torch.device("cpu"),
            spec=SPEC,
            sample_privacy=PRIVACY,
        )

    config = LocalTrainConfig(epochs=2, batch_size=8, lr=0.1)
    models = []
    for round_num, client_id in ((3, 7), (4, 7), (3, 8)):
        torch.manual_seed(0)
        models.append(mlp())
        train_context(context(models[-1], round_num, client_id), config)
    torch.manual_seed(0)
    direct = mlp()
    train(direct, seed=5, config=config, round_num=3, noise_seed=noise_seed(5, 3, 7))
    assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(), direct.parameters(), strict=True))
    assert not torch.allclose(next(models[0].parameters()), next(models[1].parameters()))
    assert not torch.allclose(next(models[0].parameters()), next(models[2].parameters()))


def test_each_training_reports_its_population_batch_and_noised_steps():
    full = train(mlp())  # 40 examples, batch 8, 2 epochs of 5 Poisson batches
    assert (full["privacy/sample/examples"], full["privacy/sample/batch_size"]) == (40.0, 8.0)
    assert full["privacy/sample/steps"] == 10.0
    # the population is the data the training is given (a capped round, a held-back split)
    part = train(mlp(), data=ClientData({k: v[:13] for k, v in client_data().arrays.items()}))
    assert part["privacy/sample/examples"] == 13.0 and part["privacy/sample/steps"] == 2 * math.ceil(13 / 8)
    # noised steps, not the epochs' batches: max_steps and a straggler's budget cut them
    assert train(mlp(), step_budget=3)["privacy/sample/steps"] == 3.0

    def no_gradient(model, batch, optimizer, backward):  # a step that releases nothing
        return (torch.zeros(()), torch.zeros(()), torch.zeros(()))

    assert train(mlp(), hooks=LocalHooks(step=no_gradient))["privacy/sample/steps"] == 0.0


def test_a_population_that_changes_within_one_training_is_refused():
    private = DpSgd(PRIVACY, mlp(), SPEC, noise_seed=1, batch_size=8)
    generator = torch.Generator().manual_seed(0)
    list(private.batches(batch_of(40), 8, generator))
    with pytest.raises(ValueError, match="drew from 40 examples, then 20"):
        list(private.batches(batch_of(20), 8, generator))
