"""FedFA's anchor loss, anchor EMA, classifier calibration and server, against hand values and a
torch autograd reference.

Model: features f = x V^T (D = 3), logits = f W^T + b (feature_reference.TwoLayer), C = 3.
Anchor loss: L_A = (1/C) sum_{c in batch} mean_{i: y_i = c} ||f_i - a_c||^2.
Per batch (here the whole client, one step per epoch):
    (V, W, b) -= lr * grad [CE(f W^T + b, y) + lambda L_A]          (f before the step)
    (W, b)    <- one Adam step on CE(A W^T + b, [0, 1, 2])          (when calibrating)
and after each epoch a_c <- m a_c + (1 - m) mean_{i: y_i = c} f_i for the classes seen.
"""

import dataclasses
import importlib
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from feature_reference import B0, SPEC3, V0, W0, feature_context, reference_params

from raysim import registry
from raysim.types import ClientResult, RunInfo

X = np.array([[1.0, 2.0], [-0.5, 1.0], [0.3, -0.7], [0.9, 0.1]])
Y = np.array([0, 0, 1, 0])  # class 2 absent: its anchor stays the global one
ANCHORS = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
LR, LAMBDA, MOMENTUM, CALIBRATION_LR = 0.2, 0.5, 0.3, 0.1

INFO = RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC3, seed=0)  # the run's facts


def plugin_module():
    return importlib.import_module(registry.get("algorithm", "fedfa").factory.__module__)


def algo(**options):
    entry = registry.get("algorithm", "fedfa")
    base = {
        "lambda_anchor": LAMBDA,
        "anchor_momentum": MOMENTUM,
        "calibration_lr": CALIBRATION_LR,
        "local": {"lr": LR, "batch_size": 8, "epochs": 2},
    }
    return entry.factory(entry.config.model_validate(base | options))


def test_anchor_loss_by_hand():
    features = torch.tensor([[1.0, 1.0], [3.0, 1.0], [0.0, 2.0]])
    anchors = torch.tensor([[1.0, 0.0], [0.0, 0.0], [5.0, 5.0]])  # class 2 absent from the batch
    y = torch.tensor([0, 0, 1])
    # class 0: (1 + 5) / 2 = 3; class 1: 4 / 1 = 4; sum 7 over C = 3
    assert float(plugin_module().anchor_loss(features, y, anchors)) == pytest.approx(7 / 3)


def test_anchor_ema_per_epoch_over_the_epochs_class_means():
    """Two batches per epoch, two epochs and a half: each epoch's class means (over examples,
    not over batches) fold in once, and ``finish`` folds the cut epoch's."""
    module = plugin_module()
    start = torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]])
    step = module.AnchorStep(
        start, algo().config, torch.nn.Linear(2, 3), calibrate=False, batches_per_epoch=2
    )
    batches = [
        (torch.tensor([[2.0, 0.0], [4.0, 0.0], [0.0, 3.0]]), torch.tensor([0, 0, 1])),
        (torch.tensor([[6.0, 6.0]]), torch.tensor([0])),  # epoch 1: class 0 mean (4, 2), class 1 (0, 3)
        (torch.tensor([[1.0, 1.0]]), torch.tensor([1])),
        (torch.tensor([[3.0, 5.0]]), torch.tensor([1])),  # epoch 2: class 1 mean (2, 3)
        (torch.tensor([[8.0, 0.0]]), torch.tensor([0])),  # cut epoch: class 0 (8, 0)
    ]
    for features, y in batches:
        step._record(features, y)
    anchors = step.finish()
    m = MOMENTUM
    a0 = m * (m * np.array([0.0, 0.0]) + (1 - m) * np.array([4.0, 2.0])) + (1 - m) * np.array([8.0, 0.0])
    a1 = m * (m * np.array([1.0, 1.0]) + (1 - m) * np.array([0.0, 3.0])) + (1 - m) * np.array([2.0, 3.0])
    assert np.allclose(anchors.numpy(), [a0, a1, [9.0, 9.0]])
    assert torch.equal(start, torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]]))  # global untouched


def reference_client(*, steps, pull, calibrate):
    x, y = torch.tensor(X), torch.tensor(Y)
    v, w, b = reference_params()
    anchors = torch.tensor(ANCHORS)
    local = anchors.clone()
    adam = torch.optim.Adam([w, b], lr=CALIBRATION_LR)
    for _ in range(steps):
        f = x @ v.T
        loss = F.cross_entropy(f @ w.T + b, y)
        if pull:
            per_class = [((f[y == c] - anchors[c]) ** 2).sum(1).mean() for c in (0, 1)]
            loss = loss + LAMBDA * sum(per_class) / 3
        grads = torch.autograd.grad(loss, (v, w, b))
        with torch.no_grad():
            for t, g in zip((v, w, b), grads):
                t -= LR * g
        if calibrate:
            adam.zero_grad()
            F.cross_entropy(anchors @ w.T + b, torch.arange(3)).backward()
            adam.step()
        for c in (0, 1):
            local[c] = MOMENTUM * local[c] + (1 - MOMENTUM) * f.detach()[y == c].mean(0)
    return [t.detach().numpy() for t in (v, w, b)], local.numpy()


@pytest.mark.parametrize(
    "round_num, options, pull, calibrate",
    [
        (0, {}, True, True),  # FedFA's own code: both from round 0
        (3, {"calibrate_from": 4}, True, False),  # the IMA setting before T/4
        (4, {"calibrate_from": 4}, True, True),
        (0, {"anchor_loss_from": 1}, False, True),  # the IMA code's round 0
    ],
)
def test_client_matches_the_reference(round_num, options, pull, calibrate):
    ctx = feature_context(
        X, Y, plugin_module().AnchorPayload(ANCHORS.astype(np.float32), 0), round_num=round_num
    )
    result = algo(**options).client_update(ctx)
    (v, w, b), anchors = reference_client(steps=2, pull=pull, calibrate=calibrate)
    assert np.allclose(result.update.delta["body.weight"].numpy(), V0 - v, atol=1e-5)
    assert np.allclose(result.update.delta["head.weight"].numpy(), W0 - w, atol=1e-5)
    assert np.allclose(result.update.delta["head.bias"].numpy(), B0 - b, atol=1e-5)
    assert np.allclose(result.update.anchors.numpy(), anchors, atol=1e-5)
    assert np.allclose(result.update.anchors.numpy()[2], ANCHORS[2])  # unseen class keeps its anchor


def test_initial_anchors():
    module = plugin_module()
    few = module.initial_anchors(3, 5, seed=7)  # C <= D: distinct standard basis vectors
    assert torch.equal(few.sum(1), torch.ones(3)) and set(few.unique().tolist()) == {0.0, 1.0}
    assert len({tuple(row.tolist()) for row in few}) == 3
    assert torch.equal(few, module.initial_anchors(3, 5, seed=7))
    many = module.initial_anchors(5, 3, seed=7)  # C > D: unit Gaussian rows
    assert torch.allclose(many.norm(dim=1), torch.ones(5))


def test_the_first_round_builds_the_anchors_from_the_seed():
    """Before any aggregate the broadcast anchors are empty; every client then starts from
    ``initial_anchors(C, D, seed)``: a client without data sends them back unchanged."""
    plugin = algo()
    params = {k: v.float() for k, v in feature_context(X, Y).global_params.items()}
    info = RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC3, seed=11)
    payload = plugin.payload(plugin.init(params, info), 0, info)  # the seed is the run's, not the state's
    assert payload.extra.anchors.size == 0
    result = plugin.client_update(feature_context(np.zeros((0, 2)), np.zeros(0), payload.extra))
    assert torch.equal(result.update.anchors, plugin_module().initial_anchors(3, 3, seed=11))


def test_server_averages_deltas_and_anchors_by_examples():
    plugin = algo()
    module = plugin_module()
    params = {"w": torch.tensor([1.0, 2.0])}
    state = plugin.init(params, RunInfo(num_clients=2, cohort_size=2, num_rounds=1, spec=SPEC3, seed=0))
    updates = [
        (module.AnchoredDelta({"w": torch.tensor([0.4, 0.0])}, torch.tensor([[1.0, 0.0], [0.0, 1.0]])), 1.0),
        (module.AnchoredDelta({"w": torch.tensor([0.1, 0.3])}, torch.tensor([[0.0, 0.0], [3.0, 1.0]])), 3.0),
    ]
    agg = plugin.aggregator()
    acc = agg.zero()
    for i, (update, n) in enumerate(updates):
        acc = agg.add(acc, i, ClientResult(update, n))
    new, _ = plugin.server_update(state, agg.result(acc), 0, INFO)
    assert torch.allclose(new.params["w"], torch.tensor([1.0 - 0.7 / 4, 2.0 - 0.9 / 4]))
    assert torch.allclose(new.extra.anchors, torch.tensor([[0.25, 0.0], [2.25, 1.0]]))
    assert [f.name for f in dataclasses.fields(new.extra)] == ["anchors"]  # no run fact in the checkpoint
    assert plugin.payload(new, 1, INFO).extra.anchors.shape == (2, 2)
    assert plugin.payload(new, 1, replace(INFO, seed=5)).extra.anchor_seed == 5


def test_a_model_without_features_is_refused():
    from reference import context, payload

    unbuilt = payload(extra=plugin_module().AnchorPayload(np.zeros(0), 0))
    with pytest.raises(TypeError, match=r"fedfa needs a model with features\(x\) and head"):
        algo().client_update(context([[1.0, 2.0]], [0], unbuilt))


def digit5_context(extra):
    """A client of IMA's cnn_digit5 on four random 3x28x28 images of Digit-Five's 10 classes."""
    from raysim import params as P
    from raysim.models import build_model
    from raysim.types import ClientContext, ClientData, DataSpec, Payload

    spec = DataSpec(task="classification", input_shape=(3, 28, 28), num_classes=10)
    torch.manual_seed(0)
    model = build_model("cnn_digit5", {}, spec)
    params = P.clone(P.model_params(model))
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(4, 3, 28, 28)).astype(np.float32), "y": np.array([0, 1, 1, 3])}
    return ClientContext(
        client_id=0,
        round_num=0,
        model=model,
        payload=Payload(P.to_numpy(params), P.to_device(extra, "cpu")),  # arrays arrive as tensors
        global_params=params,
        data=ClientData(data),
        state=None,
        seed=0,
        device=torch.device("cpu"),
        spec=spec,
    )


def test_ima_projector_models_anchor_the_128_d_projector_output():
    """IMA's code (TailinZhou/FedIMA, model.py) anchors the projector's 128-d output and its
    calibration trains the final classifier Linear alone, not the projector."""
    from raysim.models import param_groups

    ctx = digit5_context(plugin_module().AnchorPayload(np.zeros(0, np.float32), 3))
    assert plugin_module().feature_dim(ctx.model.head) == 128
    result = algo(local={"lr": LR, "batch_size": 2, "epochs": 1}).client_update(ctx)
    assert result.update.anchors.shape == (10, 128)

    model = ctx.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step = plugin_module().AnchorStep(
        result.update.anchors, algo().config, model.head, calibrate=True, batches_per_epoch=1
    )
    step._calibrate(step.calibration)
    changed = sorted(k for k, v in model.state_dict().items() if not torch.equal(v, before[k]))
    assert changed == sorted(param_groups(model)["head"]) == ["16.bias", "16.weight"]
