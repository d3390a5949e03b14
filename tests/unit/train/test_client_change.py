"""One ``ClientChange`` gives the same training in ``train_local`` (client by client) and in
``train_local_vectorized`` (the chunk at once), and both equal a plain torch loop written here.

The reference is SGD on a linear classifier: per batch (the trainer's shuffling, one
``randperm`` per epoch from the client's seed) ``g = grad CE(x W^T + b, y)``, edited as the change
says, then ``w <- w - lr g``; a watch's sums are the loop's edited gradients squared. Clients
hold unequal data, so in the vectorized trainer a client drops out of the chunk's later steps
while the other trains on: each must keep its own ``own`` tensors, accumulator and draws.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim import params as P
from raysim.train.client_change import ClientChange, PerClient, task_pass
from raysim.train.local import LocalHooks, LocalTrainConfig, train_local_watched
from raysim.train.vectorized import train_local_vectorized
from raysim.types import ClientData, DataSpec

SPEC = DataSpec("classification", (3,), 2)
SIZES = (5, 9)  # batches of 2: three for client 0, five for client 1
SEEDS = (4, 5)
CONFIG = LocalTrainConfig(lr=0.2, batch_size=2, epochs=2)
MU = 0.5
W0 = torch.tensor([[0.3, -0.2, 0.1], [-0.4, 0.25, 0.05]])
B0 = torch.tensor([0.1, -0.1])
ANCHOR = {"weight": torch.full((2, 3), 0.2), "bias": torch.tensor([0.3, -0.3])}
SHIFTS = [{"weight": torch.full((2, 3), s), "bias": torch.full((2,), -s)} for s in (0.05, -0.1)]


def model() -> nn.Module:
    net = nn.Linear(3, 2)
    with torch.no_grad():
        net.weight.copy_(W0)
        net.bias.copy_(B0)
    return net


def datas() -> list[ClientData]:
    rng = np.random.default_rng(0)
    return [
        ClientData({"x": rng.normal(size=(n, 3)).astype(np.float32), "y": rng.integers(0, 2, n)})
        for n in SIZES
    ]


def batches(data: ClientData, seed: int):
    """The trainer's order, restated: one randperm per epoch from a generator seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.from_numpy(data.arrays["x"]), torch.from_numpy(data.arrays["y"])
    for _ in range(CONFIG.epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), CONFIG.batch_size):
            idx = order[start : start + CONFIG.batch_size]
            yield x[idx], y[idx]


def reference(data: ClientData, seed: int, edit=None, alphas=None, seen=None):
    """Plain SGD; ``edit(w, g) -> g`` per step; with ``alphas`` a second step per batch on the
    loss at ``alpha w`` (one alpha per batch); ``seen`` collects each step's edited gradients.
    Returns the final weights and the mean first-step loss."""
    w = {"weight": W0.clone().requires_grad_(), "bias": B0.clone().requires_grad_()}
    losses, alphas = [], iter(alphas or [])

    def descend(scale):
        loss = F.cross_entropy(x @ (scale * w["weight"]).T + scale * w["bias"], y)
        grads = dict(zip(w, torch.autograd.grad(loss, list(w.values())), strict=True))
        grads = edit(w, grads) if edit is not None else grads
        if seen is not None:
            seen.append(grads)
        with torch.no_grad():
            for k in w:
                w[k] -= CONFIG.lr * grads[k]
        return loss

    for x, y in batches(data, seed):
        alpha = next(alphas, None)
        losses.append(float(descend(1.0).detach()) * len(y))
        if alpha is not None:
            descend(alpha)
    return {k: v.detach() for k, v in w.items()}, sum(losses) / (CONFIG.epochs * len(data))


def both_trainers(change, clients):
    """Each client's trained weights, metrics and watched accumulator, from train_local and from
    the vectorized trainer, under the shared ``change``; ``clients()`` makes fresh values for each
    client (their draws are streams)."""
    alone = []
    for data, seed, client in zip(datas(), SEEDS, clients(), strict=True):
        net = model()
        metrics, acc = train_local_watched(
            net, data, CONFIG, seed=seed, spec=SPEC, hooks=LocalHooks(change=change, client=client)
        )
        alone.append((P.model_params(net), metrics, acc))
    stacked, metrics, accs = train_local_vectorized(
        model(), datas(), CONFIG, seeds=SEEDS, spec=SPEC, change=change, clients=clients()
    )
    pick = lambda tensors, i: {k: v[i] for k, v in tensors.items()}  # noqa: E731
    chunk = [(pick(stacked, i), metrics[i], pick(accs, i)) for i in range(len(SIZES))]
    return {"train_local": alone, "vectorized": chunk}


def shifted_proximal(weights, grads, own):
    """The edit under test: a shared proximal term and the client's own shift."""
    return {k: g + MU * (weights[k] - ANCHOR[k]) + own[k] for k, g in grads.items()}


def test_one_gradient_edit_trains_alike_in_both_trainers():
    def clients():
        return [PerClient(own=shift) for shift in SHIFTS]

    for trainer, results in both_trainers(ClientChange(edit=shifted_proximal), clients).items():
        for i, (weights, metrics, _) in enumerate(results):
            shift = SHIFTS[i]

            def edit(w, g, shift=shift):
                return {k: g[k] + MU * (w[k].detach() - ANCHOR[k]) + shift[k] for k in g}

            expected, loss = reference(datas()[i], SEEDS[i], edit=edit)
            for k in expected:
                torch.testing.assert_close(
                    weights[k], expected[k], atol=1e-6, rtol=1e-5, msg=f"{trainer} {i} {k}"
                )
            assert metrics["train/loss"] == pytest.approx(loss, rel=1e-5)


def scaled(task, weights, buffers, draws):
    """A second pass: the task loss at ``alpha w``, alpha the batch's draw."""
    losses = task({k: draws[0] * w for k, w in weights.items()}, buffers)
    return losses[0], losses


def alpha_stream(seed: int):
    rng = np.random.default_rng(seed)
    return lambda: [float(rng.uniform(0.5, 1.5))]


def test_passes_and_draws_train_alike_in_both_trainers():
    def clients():
        return [PerClient(draw=alpha_stream(seed)) for seed in SEEDS]

    for trainer, results in both_trainers(ClientChange(passes=(task_pass, scaled)), clients).items():
        for i, (weights, metrics, _) in enumerate(results):
            draw = alpha_stream(SEEDS[i])
            alphas = [draw()[0] for _ in range(CONFIG.epochs * -(-SIZES[i] // CONFIG.batch_size))]
            expected, loss = reference(datas()[i], SEEDS[i], alphas=alphas)
            for k in expected:
                torch.testing.assert_close(
                    weights[k], expected[k], atol=1e-6, rtol=1e-5, msg=f"{trainer} {i} {k}"
                )
            assert metrics["train/loss"] == pytest.approx(loss, rel=1e-5)  # the first pass's loss
            assert metrics["train/steps"] == len(alphas)  # batches, not optimizer steps


FROM_STEP = (2, 5)  # each client's own: the backward pass its sums start at


def squares_from(grads, acc, own, step):
    """The watch under test: from the client's own step on, sums of the squared gradients, and a count."""
    on = step >= own["from"]
    return {k: torch.where(on, acc[k] + grads[k] ** 2, acc[k]) for k in grads} | {"n": acc["n"] + on.long()}


def test_a_watch_sees_each_backwards_edited_gradients_in_both_trainers():
    def clients():
        return [
            PerClient(
                own=shift | {"from": torch.tensor(start)},
                acc={k: torch.zeros_like(v) for k, v in ANCHOR.items()} | {"n": torch.tensor(0)},
            )
            for shift, start in zip(SHIFTS, FROM_STEP, strict=True)
        ]

    change = ClientChange(edit=shifted_proximal, watch=squares_from)
    for trainer, results in both_trainers(change, clients).items():
        for i, (_, _, acc) in enumerate(results):
            shift, seen = SHIFTS[i], []

            def edit(w, g, shift=shift):
                return {k: g[k] + MU * (w[k].detach() - ANCHOR[k]) + shift[k] for k in g}

            reference(datas()[i], SEEDS[i], edit=edit, seen=seen)
            assert int(acc["n"]) == len(seen) - FROM_STEP[i]
            for k in ANCHOR:
                expected = sum(grads[k] ** 2 for grads in seen[FROM_STEP[i] :])
                torch.testing.assert_close(acc[k], expected, atol=1e-6, rtol=1e-5, msg=f"{trainer} {i} {k}")
