"""FedFish against hand-computed values and the numpy reference; equal Fishers give FedAvg exactly."""

import dataclasses

import numpy as np
import pytest
import torch
from reference import B0, SPEC, W0, context, grad, payload

from raysim import registry
from raysim.types import ClientResult, RunInfo

X = np.array([[1.0, 2.0], [0.5, -1.0], [0.0, 1.0]])
Y = np.array([0, 1, 1])
LR = 0.1

INFO = RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC, seed=0)  # the run's facts


def plugin(name="fedfish", **options):
    entry = registry.get("algorithm", name)
    return entry.factory(entry.config.model_validate(options))


def fish_module():
    return registry.get("algorithm", "fedfish").factory.__module__


def update(delta, fisher):
    """A client's ``FisherUpdate``: its delta and its diagonal Fisher."""
    return __import__(fish_module(), fromlist=["FisherUpdate"]).FisherUpdate(delta, fisher)


def test_aggregate_matches_hand_computation_with_a_zero_fisher_coordinate():
    """Coordinate 0: (2*1*1 + 1*3*3) / (2*1 + 1*3) = 11/5. Coordinate 1 has F = 0 for both
    clients, so it falls back to FedAvg: (2*2 + 1*4) / 3 = 8/3."""
    agg = plugin().aggregator()

    def result(delta, fisher, weight):
        sent = update({"p": torch.tensor(delta)}, {"p": torch.tensor(fisher)})
        return ClientResult(sent, weight)

    a, b = result([1.0, 2.0], [1.0, 0.0], 2.0), result([3.0, 4.0], [3.0, 0.0], 1.0)
    out = agg.result(agg.merge(agg.add(agg.zero(), 0, a), agg.add(agg.zero(), 1, b)))
    assert out.pseudo_grad["p"].tolist() == pytest.approx([11 / 5, 8 / 3])
    assert out.zero_fisher_fraction == 0.5


def test_server_update_logs_the_norm_ratio_to_fedavgs_mean_delta():
    """Same two clients as above: FedFish pg = (11/5, 8/3); FedAvg's mean delta =
    ((2*1 + 1*3)/3, (2*2 + 1*4)/3) = (5/3, 8/3). Ratio = |(11/5, 8/3)| / |(5/3, 8/3)|."""
    algo = plugin(server={"kind": "sgd", "lr": 1.0})
    state = algo.init(
        {"p": torch.zeros(2)}, RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC, seed=0)
    )
    agg = algo.aggregator()

    def result(delta, fisher, weight):
        return ClientResult(update({"p": torch.tensor(delta)}, {"p": torch.tensor(fisher)}), weight)

    acc = agg.add(
        agg.add(agg.zero(), 0, result([1.0, 2.0], [1.0, 0.0], 2.0)), 1, result([3.0, 4.0], [3.0, 0.0], 1.0)
    )
    _, metrics = algo.server_update(state, agg.result(acc), 0, INFO)
    expected = np.hypot(11 / 5, 8 / 3) / np.hypot(5 / 3, 8 / 3)
    assert metrics["fedfish/norm_ratio_to_fedavg"] == pytest.approx(expected)
    assert metrics["server/delta_norm"] == pytest.approx(np.hypot(11 / 5, 8 / 3))


def test_buffers_without_fisher_are_averaged():
    agg = plugin().aggregator()
    r = ClientResult(update({"bn.mean": torch.tensor([2.0])}, {}), 1.0)
    s = ClientResult(update({"bn.mean": torch.tensor([4.0])}, {}), 3.0)
    out = agg.result(agg.add(agg.add(agg.zero(), 0, r), 1, s))
    assert out.pseudo_grad["bn.mean"].item() == pytest.approx(3.5)


def test_zero_fisher_fraction_counts_parameters_only():
    """Parameter "w" has 2 coordinates, one with F = 0 in both clients: 1/2. The float buffer
    "bn.mean" (2 coordinates, never a Fisher) is in neither the count nor the total; counting
    it would give (1 + 2) / 4. Two partials merged keep knowing which keys are parameters."""
    agg = plugin().aggregator()

    def result(fisher):
        delta = {"w": torch.tensor([1.0, 2.0]), "bn.mean": torch.tensor([0.5, 0.5])}
        return ClientResult(update(delta, {"w": torch.tensor(fisher)}), 1.0)

    left, right = agg.add(agg.zero(), 0, result([1.0, 0.0])), agg.add(agg.zero(), 1, result([2.0, 0.0]))
    assert agg.result(agg.merge(left, right)).zero_fisher_fraction == 0.5
    assert agg.result(agg.merge(agg.zero(), right)).zero_fisher_fraction == 0.5


def test_extra_pass_fisher_is_the_squared_batch_gradient_at_the_final_weights():
    """One full-batch step: w1 = w0 - lr g(w0); then one full batch: F = g(w1)^2."""
    result = plugin(local={"lr": LR, "batch_size": 3, "epochs": 1}).client_update(context(X, Y, payload()))
    gw, gb = grad(W0, B0, X, Y)
    w1, b1 = W0 - LR * gw, B0 - LR * gb
    fw, fb = grad(w1, b1, X, Y)
    assert np.allclose(result.update.fisher["weight"].numpy(), fw**2, atol=1e-7)
    assert np.allclose(result.update.fisher["bias"].numpy(), fb**2, atol=1e-7)
    assert np.allclose(result.update.delta["weight"].numpy(), LR * gw, atol=1e-6)
    assert result.weight == 3.0


def test_batches_of_one_sum_per_example_squares_and_mean_divides_by_batches():
    ctx = context(X, Y, payload())
    plugin(local={"lr": LR, "batch_size": 3, "epochs": 1}).client_update(ctx)  # model now at w1
    gw, gb = grad(W0, B0, X, Y)
    w1, b1 = W0 - LR * gw, B0 - LR * gb
    expected = sum(grad(w1, b1, X[i : i + 1], Y[i : i + 1])[0] ** 2 for i in range(3))
    fisher_pass = __import__(fish_module(), fromlist=["fisher_pass"]).fisher_pass
    summed = fisher_pass(ctx.model, ctx.data, 1, SPEC, ctx.device, seed=0)
    assert np.allclose(summed["weight"].numpy(), expected, atol=1e-7)
    mean = fisher_pass(ctx.model, ctx.data, 1, SPEC, ctx.device, seed=0, reduce="mean")
    assert np.allclose(mean["weight"].numpy(), expected / 3, atol=1e-7)


def test_last_epoch_ablation_squares_the_last_epochs_training_gradients():
    """Two full-batch epochs: the last epoch's only step has gradient g(w1) at its pre-update weights."""
    result = plugin(fisher_source="last_epoch", local={"lr": LR, "batch_size": 3, "epochs": 2}).client_update(
        context(X, Y, payload())
    )
    gw, gb = grad(W0, B0, X, Y)
    fw, _ = grad(W0 - LR * gw, B0 - LR * gb, X, Y)
    assert np.allclose(result.update.fisher["weight"].numpy(), fw**2, atol=1e-7)


def test_last_epoch_under_a_step_budget_is_the_last_epoch_the_client_starts():
    """Three full-batch epochs planned, a straggler's budget of two steps: its last epoch is the
    second, whose only step has gradient g(w1), as with two epochs and no budget."""
    ctx = dataclasses.replace(context(X, Y, payload()), step_budget=2)
    fish = plugin(fisher_source="last_epoch", local={"lr": LR, "batch_size": 3, "epochs": 3})
    result = fish.client_update(ctx)
    assert result.metrics["train/steps"] == 2
    gw, gb = grad(W0, B0, X, Y)
    fw, _ = grad(W0 - LR * gw, B0 - LR * gb, X, Y)
    assert np.allclose(result.update.fisher["weight"].numpy(), fw**2, atol=1e-7)


def test_equal_fishers_give_fedavg_bit_for_bit(monkeypatch):
    """Every F_i = 0.25 (a power of two keeps products exact): FedFish's mean is FedAvg's."""
    module = __import__(fish_module(), fromlist=["fisher_pass"])
    monkeypatch.setattr(
        module,
        "fisher_pass",
        lambda model, *a, **k: {n: torch.full_like(p, 0.25) for n, p in model.named_parameters()},
    )
    server = {"kind": "sgd", "lr": 1.0}
    local = {"lr": LR, "batch_size": 2, "epochs": 2}
    outcomes = []
    for name in ("fedfish", "fedavg"):
        algo = plugin(name, local=local, server=server)
        params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
        state = algo.init(params, RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC, seed=0))
        agg = algo.aggregator()
        acc = agg.zero()
        for i, (x, y) in enumerate([(X, Y), (X[:1] * 2, Y[:1])]):
            acc = agg.add(
                acc, i, algo.client_update(context(x, y, algo.payload(state, 0, INFO), client_id=i))
            )
        outcomes.append(algo.server_update(state, agg.result(acc), 0, INFO)[0].params)
    fish, avg = outcomes
    assert all(torch.equal(fish[k], avg[k]) for k in fish)
    assert not torch.equal(fish["weight"], torch.tensor(W0).float())


def test_unequal_fishers_differ_from_fedavg():
    local = {"lr": LR, "batch_size": 1, "epochs": 2}
    results = {}
    for name in ("fedfish", "fedavg"):
        algo = plugin(name, local=local, server={"kind": "sgd", "lr": 1.0})
        state = algo.init(
            {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()},
            RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC, seed=0),
        )
        agg = algo.aggregator()
        acc = agg.zero()
        for i, (x, y) in enumerate([(X, Y), (X[:1] * 2, Y[:1])]):
            acc = agg.add(
                acc, i, algo.client_update(context(x, y, algo.payload(state, 0, INFO), client_id=i))
            )
        results[name] = algo.server_update(state, agg.result(acc), 0, INFO)[0].params["weight"]
    assert not torch.allclose(results["fedfish"], results["fedavg"], atol=1e-6)


def test_the_fisher_pass_leaves_batchnorm_statistics_as_training_left_them(monkeypatch):
    """The barrier's local term is measured on theta_i: the extra pass must not move BN buffers."""
    from torch import nn

    from raysim.types import ClientContext, ClientData, DataSpec, Payload

    spec = DataSpec("classification", (2,), 2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    from raysim import params as P

    start = P.clone(P.model_params(model))
    data = ClientData(
        {"x": np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32), "y": np.array([0, 1] * 4)}
    )
    captured = {}
    module = __import__(fish_module(), fromlist=["fisher_pass"])
    original = module.fisher_pass

    def spy(model, *args, **kwargs):
        captured["before"] = model[1].running_mean.clone()
        return original(model, *args, **kwargs)

    monkeypatch.setattr(module, "fisher_pass", spy)
    ctx = ClientContext(
        0, 0, model, Payload(P.to_numpy(start)), start, data, None, 0, torch.device("cpu"), spec
    )
    plugin(local={"lr": 0.1, "batch_size": 4}).client_update(ctx)
    assert torch.equal(model[1].running_mean, captured["before"])


def test_last_epoch_fisher_refuses_max_steps():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="needs whole epochs"):
        registry.get("algorithm", "fedfish").config.model_validate(
            {"fisher_source": "last_epoch", "local": {"max_steps": 3}}
        )


def test_float32_accumulation_matches_float64_and_leaves_client_tensors_alone():
    fish64, fish32 = plugin().aggregator(), plugin(accumulate="float32").aggregator()
    delta, fisher = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.5, 0.0, 2.0])
    result = ClientResult(update({"p": delta}, {"p": fisher}), 3.0)
    other = ClientResult(update({"p": -delta}, {"p": fisher * 3}), 1.0)
    outs = [agg.result(agg.add(agg.add(agg.zero(), 0, result), 1, other)) for agg in (fish64, fish32)]
    assert torch.allclose(outs[0].pseudo_grad["p"], outs[1].pseudo_grad["p"], atol=1e-6)
    assert delta.tolist() == [1.0, -2.0, 0.5] and fisher.tolist() == [0.5, 0.0, 2.0]


def test_a_client_stopped_by_max_steps_weighs_the_examples_it_trained_on():
    """Three examples, batch 1, max_steps 2: the client saw two of them, so its weight is 2."""
    result = plugin(local={"lr": LR, "batch_size": 1, "max_steps": 2}).client_update(context(X, Y, payload()))
    assert result.weight == 2.0
    whole = plugin(local={"lr": LR, "batch_size": 1}).client_update(context(X, Y, payload()))
    assert whole.weight == 3.0


def test_norms_count_parameters_not_batchnorm_statistics():
    """Both methods average buffers, so including them would pull the ratio towards 1: with
    pg = (3, 4) on the parameter and a buffer moving by 100, |pg| is 5, not |(3, 4, 100)|."""
    algo = plugin(server={"kind": "sgd", "lr": 1.0})
    info = RunInfo(
        num_clients=1, cohort_size=1, num_rounds=1, spec=SPEC, seed=0, buffer_keys=frozenset({"bn"})
    )
    state = algo.init({"p": torch.zeros(2), "bn": torch.zeros(1)}, info)
    aggregate = __import__(fish_module(), fromlist=["FisherAggregate"]).FisherAggregate(
        pseudo_grad={"p": torch.tensor([3.0, 4.0]), "bn": torch.tensor([100.0])},
        zero_fisher_fraction=0.0,
        fedavg_norm=2.5,
    )
    _, metrics = algo.server_update(state, aggregate, 0, INFO)
    assert metrics["server/delta_norm"] == pytest.approx(5.0)
    assert metrics["fedfish/norm_ratio_to_fedavg"] == pytest.approx(2.0)
