"""The shared local trainer: capped subsets, lr schedule, hooks, steps, evaluation."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from raysim import params as P
from raysim.measure.evaluate import evaluate
from raysim.train.batching import iterate_batches
from raysim.train.client_change import ClientChange
from raysim.train.local import LocalHooks, LocalTrainConfig, round_lr, train_client, train_local
from raysim.train.task_loss import outputs_loss, task_loss
from raysim.types import ClientContext, ClientData, DataSpec, Payload

SPEC = DataSpec("classification", (3,), 2)


def data(n=12):
    rng = np.random.default_rng(0)
    return ClientData(
        {"x": rng.normal(size=(n, 3)).astype(np.float32), "y": (np.arange(n) % 2).astype(np.int64)}
    )


def model():
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def test_lr_decays_per_round():
    config = LocalTrainConfig(lr=0.1, lr_decay=0.5, batch_size=12)
    assert round_lr(config, 2) == pytest.approx(0.025)
    decayed, plain = model(), model()
    train_local(decayed, data(), config, seed=0, spec=SPEC, round_num=2)
    train_local(plain, data(), LocalTrainConfig(lr=0.025, batch_size=12), seed=0, spec=SPEC)
    assert torch.allclose(decayed.weight, plain.weight)


def test_loss_fn_replaces_the_task_loss():
    zero = lambda m, batch, spec: ((m(batch["x"]) * 0).sum(), 0, len(batch["y"]))  # noqa: E731
    net = model()
    before = net.weight.detach().clone()
    metrics = train_local(net, data(), LocalTrainConfig(), seed=0, spec=SPEC, hooks=LocalHooks(loss_fn=zero))
    assert torch.equal(net.weight, before) and metrics["train/loss"] == 0.0


def test_max_steps_and_batches():
    metrics = train_local(
        model(), data(12), LocalTrainConfig(batch_size=5, epochs=3, max_steps=4), seed=0, spec=SPEC
    )
    assert metrics["train/steps"] == 4
    sizes = [len(b["y"]) for b in iterate_batches({"y": torch.arange(12)}, 5)]
    assert sizes == [5, 5, 2]


def test_evaluate_matches_a_direct_computation():
    net, d = model(), data()
    metrics = evaluate(net, d, SPEC, batch_size=5)
    logits = net(torch.from_numpy(d.arrays["x"])).detach()
    y = torch.from_numpy(d.arrays["y"])
    assert metrics["loss"] == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert metrics["num_examples"] == 12


def test_causal_lm_loss_ignores_padding_and_shifts():
    spec = DataSpec("causal_lm", (4,), 5, pad_token_id=0)

    class Echo(nn.Module):  # predicts "next token = current token + 1" with certainty
        def forward(self, x):
            return torch.nn.functional.one_hot((x + 1) % 5, 5).float() * 50

    batch = {"x": torch.tensor([[1, 2, 3, 0], [2, 3, 4, 4]])}
    loss, correct, count = task_loss(Echo(), batch, spec)
    # targets: [2, 3, 0(pad)] and [3, 4, 4]: 5 real targets, the echo gets 2,3 and 3,4 right (4)
    assert count == 5 and correct == 4


def test_causal_lm_loss_is_the_mean_over_shifted_unpadded_targets():
    """Against the loss written out by hand: every position t < T-1 whose next token is not
    padding contributes -log softmax(logits[t])[x[t+1]], averaged over those positions."""
    spec = DataSpec("causal_lm", (6,), 7, pad_token_id=0)
    logits = torch.randn(3, 6, 7, generator=torch.Generator().manual_seed(0))
    x = torch.tensor([[1, 2, 3, 4, 5, 6], [2, 3, 0, 0, 0, 0], [6, 5, 4, 3, 2, 1]])
    terms, right = [], 0
    for b in range(3):
        for t in range(5):
            if x[b, t + 1] != 0:
                terms.append(-torch.log_softmax(logits[b, t].double(), 0)[x[b, t + 1]])
                right += int(logits[b, t].argmax() == x[b, t + 1])
    loss, correct, count = outputs_loss(logits, {"x": x}, spec)
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-6)
    assert (int(correct), int(count)) == (right, len(terms))


def test_default_step_matches_a_hand_written_loop():
    """The default step is "forward, zero_grad, backward, the change's edit, clip, step" per batch.

    The reference loop below is that sequence written out with torch alone (same shuffling:
    one randperm per epoch from a generator seeded with the client seed); the results must be
    equal bit for bit, with momentum, weight decay, both hooks and clipping in play.
    """
    config = LocalTrainConfig(epochs=2, batch_size=5, lr=0.1, momentum=0.9, weight_decay=0.01, grad_clip=0.3)
    extra = lambda m, batch: 0.1 * (m.weight**2).sum()  # noqa: E731

    def shift(m):
        m.bias.grad.add_(0.05)

    trained, reference = model(), model()
    change = ClientChange(edit=lambda weights, grads, own: grads | {"bias": grads["bias"] + 0.05})
    train_local(trained, data(), config, seed=4, spec=SPEC, hooks=LocalHooks(change=change, extra_loss=extra))

    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    x, y = torch.from_numpy(data().arrays["x"]), torch.from_numpy(data().arrays["y"])
    generator = torch.Generator().manual_seed(4)
    for _ in range(2):
        order = torch.randperm(12, generator=generator)
        for start in range(0, 12, 5):
            idx = order[start : start + 5]
            loss = nn.functional.cross_entropy(reference(x[idx]), y[idx]) + extra(reference, None)
            opt.zero_grad()
            loss.backward()
            shift(reference)
            nn.utils.clip_grad_norm_(reference.parameters(), 0.3)
            opt.step()
    assert torch.equal(trained.weight, reference.weight) and torch.equal(trained.bias, reference.bias)


REGRESSION = DataSpec("regression", (3,), 2)


def regression_data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 3))
    return ClientData(
        {"x": x.astype(np.float32), "y": (x @ [[1.0, 0.5], [-1.0, 0.0], [0.2, 2.0]]).astype(np.float32)}
    )


def mse_grad(w, b, x, y):
    """Gradient of mean((x w^T + b - y)^2) over the B x C entries: 2 r^T x / (BC), 2 sum_B r / (BC)."""
    r = x @ w.T + b - y
    return 2 * r.T @ x / r.size, 2 * r.sum(0) / r.size


def test_a_step_may_take_several_optimizer_steps_per_batch():
    """FedGuCci's sequential mode: a task step, then a step on another loss, on the same batch.

    One batch of all 6 examples, SGD with momentum m = 0.9 (applied at every optimizer step):
        g1 = grad L(w0);           buf1 = g1;              w1 = w0 - lr buf1
        g2 = 0.5 grad L(w1);       buf2 = m buf1 + g2;     w2 = w1 - lr buf2
    The metrics count one batch and the loss of its first pass, L(w0).
    """

    def half(net, batch, spec):
        loss, num_correct, num_items = task_loss(net, batch, spec)
        return 0.5 * loss, num_correct, num_items

    def task_then_half(net, batch, optimizer, backward):
        loss = backward(batch)
        optimizer.step()
        backward(batch, loss_fn=half)
        optimizer.step()
        return loss

    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    w0, b0 = net.weight.detach().double().numpy().copy(), net.bias.detach().double().numpy().copy()
    d = regression_data()
    config = LocalTrainConfig(batch_size=6, lr=0.1, momentum=0.9)
    metrics = train_local(net, d, config, seed=0, spec=REGRESSION, hooks=LocalHooks(step=task_then_half))

    x, y, lr = d.arrays["x"].astype(np.float64), d.arrays["y"].astype(np.float64), 0.1
    gw1, gb1 = mse_grad(w0, b0, x, y)
    w1, b1 = w0 - lr * gw1, b0 - lr * gb1
    gw2, gb2 = mse_grad(w1, b1, x, y)
    w2, b2 = w1 - lr * (0.9 * gw1 + 0.5 * gw2), b1 - lr * (0.9 * gb1 + 0.5 * gb2)
    assert np.allclose(net.weight.detach().numpy(), w2, atol=1e-6)
    assert np.allclose(net.bias.detach().numpy(), b2, atol=1e-6)
    assert metrics["train/steps"] == 1
    assert metrics["train/loss"] == pytest.approx(np.mean((x @ w0.T + b0 - y) ** 2), rel=1e-5)


@pytest.mark.parametrize(
    ("epochs", "max_steps", "expected"),
    [(1, 1, 5), (1, 2, 10), (1, 3, 12), (3, 4, 12), (3, None, 12)],
)
def test_num_examples_counts_the_distinct_examples_trained_on(epochs, max_steps, expected):
    """12 examples in batches of 5, 5, 2 per epoch; a second epoch revisits the same 12."""
    config = LocalTrainConfig(batch_size=5, epochs=epochs, max_steps=max_steps)
    metrics = train_local(model(), data(12), config, seed=0, spec=SPEC)
    assert metrics["train/num_examples"] == expected


def client_context(client_data):
    net = model()
    return ClientContext(
        client_id=0,
        round_num=0,
        model=net,
        payload=Payload({}),
        global_params=P.clone(P.model_params(net)),
        data=client_data,
        state=None,
        seed=0,
        device=torch.device("cpu"),
        spec=SPEC,
    )


def test_a_client_counts_the_examples_it_trained_on():
    """max_steps = 2 batches of 5 out of 12 examples: the client's weight is 10, not 12."""
    _, metrics = train_client(client_context(data(12)), LocalTrainConfig(batch_size=5, max_steps=2))
    assert metrics["train/num_examples"] == 10.0
    _, metrics = train_client(client_context(data(12)), LocalTrainConfig(batch_size=5))
    assert metrics["train/num_examples"] == 12.0


def test_a_client_sends_global_minus_local():
    """One full batch of plain SGD: local = global - lr * grad, so delta = lr * grad."""
    ctx = client_context(data(12))
    start = P.clone(P.model_params(ctx.model))
    delta, _ = train_client(ctx, LocalTrainConfig(batch_size=12, lr=0.5))
    moved = P.model_params(ctx.model)
    assert all(torch.allclose(delta[k], start[k] - moved[k]) for k in start)
    assert any(torch.count_nonzero(v) for v in delta.values())


def test_a_client_passes_loss_fn_and_step_on():
    zero = lambda m, batch, spec: ((m(batch["x"]) * 0).sum(), 0, len(batch["y"]))  # noqa: E731
    delta, _ = train_client(client_context(data()), LocalTrainConfig(), LocalHooks(loss_fn=zero))
    assert all(torch.count_nonzero(v) == 0 for v in delta.values())

    def no_update(net, batch, optimizer, backward):
        return backward(batch)

    delta, _ = train_client(client_context(data()), LocalTrainConfig(), LocalHooks(step=no_update))
    assert all(torch.count_nonzero(v) == 0 for v in delta.values())


def test_a_client_keeps_to_its_step_budget():
    """A straggler's context caps its batches below max_steps (and the budget alone caps too)."""
    ctx = client_context(data(40))
    capped = replace(ctx, step_budget=3)
    assert train_client(capped, LocalTrainConfig(batch_size=4, max_steps=5))[1]["train/steps"] == 3
    assert train_client(capped, LocalTrainConfig(batch_size=4))[1]["train/steps"] == 3
    assert train_client(ctx, LocalTrainConfig(batch_size=4))[1]["train/steps"] == 10


def test_a_step_budget_caps_train_local_whatever_its_config():
    spec = DataSpec("classification", (3,), 2)
    rng = np.random.default_rng(0)
    data = ClientData({"x": rng.normal(size=(40, 3)).astype(np.float32), "y": np.arange(40) % 2})

    def steps(config, budget):
        metrics = train_local(nn.Linear(3, 2), data, config, seed=1, spec=spec, step_budget=budget)
        return metrics["train/steps"]

    config = LocalTrainConfig(epochs=2, batch_size=8)  # 5 batches a pass, 10 in all
    assert steps(config, None) == 10 and steps(config, 3) == 3 and steps(config, 50) == 10
    assert steps(config.model_copy(update={"max_steps": 2}), 3) == 2
