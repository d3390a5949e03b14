"""FedGuCci and FedGuCci+ (algorithms/fedgucci.py) against hand-derived values and a numpy
reference of the authors' client loop (Li et al., KDD 2025, arXiv:2402.18949).

Connectivity term of anchor a at alpha, with m = alpha w + (1 - alpha) a:
    c(w) = (beta / n) * l(m),    grad_w c = (beta * alpha / n) * grad l(m)      (chain rule)
so alpha = 1 gives l(w) and its gradient (times beta / n), and a = w gives l(w) at any alpha.

The code's loop on one batch (sequential mode), SGD with momentum mu and weight decay wd, where
every step is  d = g + wd w;  buf = mu buf + d (buf = d at the first step);  w <- w - lr buf:
    task step:            g = grad l(w)
    then for each anchor: g = (beta alpha / n) grad l(alpha w + (1 - alpha) a_j)   (updated w)
FedGuCci+ uses the FedLC loss for l and SAM for every step: g is replaced by the gradient at
w + rho g / ||g|| (for a connectivity step, of c at the perturbed w, m recomputed from it); the
code's quirk steps a connectivity step on the clean plus the perturbed gradient.

For the linear softmax model z = x W^T + b - shift (shift = tau n_c^(-1/4) under FedLC, else 0),
grad l = ((p - onehot)^T x / B, mean(p - onehot)) with p = softmax(z).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from reference import B0, SPEC, W0, context, payload, plugin_types
from torch import nn

from raysim import params as P
from raysim import registry
from raysim.checkpoint import CheckpointTrail, load_checkpoint, save_checkpoint
from raysim.config import JobConfig, validate_job
from raysim.errors import CheckpointError, ConfigError
from raysim.stored import from_plain
from raysim.train.at_weights import at_weights
from raysim.train.task_loss import task_loss
from raysim.types import ClientResult, DataSpec, RunInfo

X = np.array([[1.0, 2.0], [-0.5, 1.0], [0.3, -1.2], [2.0, 0.1]])
Y = np.array([0, 1, 0, 0])  # unequal counts (3, 1): FedLC's shift differs per class
A1 = (np.array([[0.2, 0.1], [-0.3, 0.4]]), np.array([0.1, 0.0]))  # an older anchor (round t-1)

INFO = RunInfo(num_clients=4, cohort_size=2, num_rounds=5, spec=SPEC, seed=0)  # the run's facts


def plugin(name="fedgucci", **options):
    entry = registry.get("algorithm", name)
    return entry.factory(entry.config.model_validate(options))


def module():
    """The loaded plugin module (algorithms are files, not an importable package)."""
    return sys.modules[registry.get("algorithm", "fedgucci").factory.__module__]


def anchors_payload(*older):
    anchors = [{"weight": w.astype(np.float32), "bias": b.astype(np.float32)} for w, b in older]
    return payload(extra=plugin_types(plugin()).Anchors(anchors))


def grad(w, b, x, y, shift=0.0):
    z = x @ w.T + b - shift
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    err = p - np.eye(w.shape[0])[y]
    return err.T @ x / len(x), err.mean(0)


def sgd(w, g, buf, lr, momentum, wd):
    d = g + wd * w
    buf = d if buf is None else momentum * buf + d
    return w - lr * buf, buf


def reference_client(anchors, *, lr, momentum, wd, beta, alpha, epochs, shift=0.0, rho=None, quirk=False):
    """The authors' loop, full batch (one batch per epoch), on (W, b) as one flat vector."""
    n = len(anchors)
    shapes = [W0.shape, B0.shape]

    def unflat(v):
        return v[:4].reshape(shapes[0]), v[4:]

    def g_task(v):
        gw, gb = grad(*unflat(v), X, Y, shift)
        return np.concatenate([gw.ravel(), gb])

    def g_conn(v, a):
        return beta * alpha / n * g_task(alpha * v + (1 - alpha) * a)

    def sam(gradient, v, add_clean=False):
        g = gradient(v)
        if rho is None:
            return g
        perturbed = gradient(v + rho * g / (np.linalg.norm(g) + 1e-16))
        return perturbed + g if add_clean else perturbed

    v = np.concatenate([W0.ravel(), B0])
    flat_anchors = [np.concatenate([w.ravel(), b]) for w, b in anchors]
    buf = None
    for _ in range(epochs):
        v, buf = sgd(v, sam(g_task, v), buf, lr, momentum, wd)
        for a in flat_anchors:
            v, buf = sgd(v, sam(lambda u, a=a: g_conn(u, a), v, quirk), buf, lr, momentum, wd)
    w, b = unflat(v)
    return W0 - w, B0 - b


def delta(result: ClientResult):
    return result.update["weight"].double().numpy(), result.update["bias"].double().numpy()


# ---- the connectivity term -------------------------------------------------------------------


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 5), nn.Tanh(), nn.Linear(5, 2)).double()


def batch():
    return {"x": torch.tensor(X), "y": torch.tensor(Y)}


def connectivity(model, anchors, alpha, beta=1.0):
    return module().Connectivity(model, anchors, beta, alpha, np.random.default_rng(0))


def run_pass(one_pass, model, batch, conn):
    """``one_pass`` at the live model's weights: the task loss at other weights by functional_call."""
    weights = {k: p for k, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())

    def task(at, at_buffers):
        return task_loss(at_weights(model, at | at_buffers), batch, SPEC)

    return one_pass(task, weights, buffers, conn.alphas)


def interpolated(conn, model, batch, j):
    return run_pass(lambda *args: (None, conn.interpolated_loss(*args, j)), model, batch, conn)[1]


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_alpha_one_gives_the_task_loss_and_its_gradient():
    model = mlp()
    anchor = {k: torch.randn_like(v) for k, v in model.named_parameters()}
    loss = interpolated(connectivity(model, [anchor], alpha=1.0), model, batch(), 0)[0]
    loss.backward()
    conn_grads = grads(model)
    model.zero_grad()
    plain = task_loss(model, batch(), SPEC)[0]
    plain.backward()
    assert torch.allclose(loss, plain, atol=1e-12)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(conn_grads, grads(model), strict=True))


def test_an_anchor_equal_to_w_gives_the_task_loss_at_any_alpha():
    model = mlp()
    anchor = {k: v.detach().clone() for k, v in model.named_parameters()}
    plain = task_loss(model, batch(), SPEC)[0]
    for alpha in (0.0, 0.3, 0.5):
        loss = interpolated(connectivity(model, [anchor], alpha), model, batch(), 0)[0]
        assert torch.allclose(loss, plain, atol=1e-12)


@pytest.mark.parametrize("alpha", [0.5, 0.2])
def test_the_gradient_is_alpha_times_the_gradient_at_the_interpolated_point(alpha):
    """functional_call autograd vs the code's way: copy m into a scratch model, back-propagate
    there, scale by beta alpha / n. The anchor (which here would accept gradients) gets none."""
    model, beta = mlp(), 0.3
    anchors = [
        {k: torch.randn_like(v).requires_grad_(True) for k, v in model.named_parameters()} for _ in range(2)
    ]
    conn = connectivity(model, anchors, alpha, beta)
    loss = run_pass(conn.term(1), model, batch(), conn)[0]
    loss.backward()

    scratch = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in scratch.named_parameters():
            p.copy_(alpha * dict(model.named_parameters())[name] + (1 - alpha) * anchors[1][name])
    F.cross_entropy(scratch(batch()["x"]), batch()["y"]).backward()
    for (name, p), q in zip(model.named_parameters(), scratch.parameters(), strict=True):
        assert torch.allclose(p.grad, beta * alpha / 2 * q.grad, atol=1e-12), name
    assert all(a.grad is None for anchor in anchors for a in anchor.values())


def test_uniform_alphas_are_redrawn_per_batch_in_the_unit_interval():
    conn = module().Connectivity(mlp(), [{}, {}, {}], 0.1, None, np.random.default_rng(0))
    first = list(conn.alphas)
    conn.redraw()
    assert len(first) == 3 and all(0 <= a <= 1 for a in first + conn.alphas) and first != conn.alphas
    fixed = module().Connectivity(mlp(), [{}, {}], 0.1, 0.5, np.random.default_rng(0))
    fixed.redraw()
    assert fixed.alphas == [0.5, 0.5]


# ---- the client against FedAvg and the authors' loop ------------------------------------------


def client(name="fedgucci", older=(), **options):
    algo = plugin(name, **options)
    return algo.client_update(context(X, Y, anchors_payload(*older)))


def test_sequential_with_beta_zero_is_fedavg_without_momentum_and_weight_decay():
    local = {"lr": 0.3, "batch_size": 2, "epochs": 2}
    fedavg = plugin("fedavg", local=local).client_update(context(X, Y, payload()))
    gucci = client(older=[A1], beta=0.0, num_anchors=2, local=local)
    assert all(torch.equal(gucci.update[k], fedavg.update[k]) for k in ("weight", "bias"))
    assert gucci.weight == fedavg.weight == 4 and gucci.metrics == fedavg.metrics


def test_sequential_with_beta_zero_still_moves_under_momentum():
    """Each zero-gradient connectivity step still applies momentum (the authors' code's sequential
    steps): not FedAvg."""
    local = {"lr": 0.3, "batch_size": 4, "epochs": 2, "momentum": 0.9}
    fedavg = plugin("fedavg", local=local).client_update(context(X, Y, payload()))
    gucci = client(beta=0.0, local=local)
    assert not torch.allclose(gucci.update["weight"], fedavg.update["weight"], atol=1e-4)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_joint_with_beta_zero_is_fedavg_under_any_optimizer(optimizer):
    local = {"lr": 0.1, "batch_size": 2, "epochs": 2, "momentum": 0.9, "weight_decay": 1e-2}
    local |= {"optimizer": optimizer, "momentum": 0.0} if optimizer == "adam" else {}
    fedavg = plugin("fedavg", local=local).client_update(context(X, Y, payload()))
    gucci = client(older=[A1], beta=0.0, num_anchors=2, update_mode="joint", local=local)
    assert all(torch.equal(gucci.update[k], fedavg.update[k]) for k in ("weight", "bias"))


LOOP = {"lr": 0.2, "momentum": 0.9, "wd": 0.01, "beta": 0.5, "alpha": 0.5}


def loop_options(**extra):
    local = {"lr": LOOP["lr"], "momentum": LOOP["momentum"], "weight_decay": LOOP["wd"], "batch_size": 4}
    return {"beta": LOOP["beta"], "num_anchors": 2, "local": local | {"epochs": 2}} | extra


def test_sequential_mode_is_the_authors_loop_with_momentum_and_weight_decay():
    """Two batches (full-batch epochs), two anchors: 6 optimizer steps sharing one momentum buffer."""
    result = client(older=[A1], **loop_options())
    dw, db = reference_client([(W0, B0), A1], epochs=2, **LOOP)
    assert np.allclose(delta(result)[0], dw, atol=1e-6) and np.allclose(delta(result)[1], db, atol=1e-6)
    assert result.metrics["train/steps"] == 2  # batches, however many optimizer steps


def test_a_fixed_alpha_other_than_one_half_weights_the_local_model():
    result = client(older=[A1], **loop_options(alpha=0.8))
    dw, _ = reference_client([(W0, B0), A1], epochs=2, **(LOOP | {"alpha": 0.8}))
    assert np.allclose(delta(result)[0], dw, atol=1e-6)


def test_joint_mode_takes_one_step_on_eq_13():
    """One full batch: w1 = w0 - lr (grad l(w0) + (beta / n) sum_j alpha grad l(m_j)), plain SGD."""
    options = {"beta": 0.5, "num_anchors": 2, "update_mode": "joint", "local": {"lr": 0.2, "batch_size": 4}}
    result = client(older=[A1], **options)
    v0 = np.concatenate([W0.ravel(), B0])
    g = np.concatenate([a.ravel() for a in grad(W0, B0, X, Y)])
    for aw, ab in [(W0, B0), A1]:
        m = 0.5 * v0 + 0.5 * np.concatenate([aw.ravel(), ab])
        g += 0.5 * 0.5 / 2 * np.concatenate([a.ravel() for a in grad(m[:4].reshape(2, 2), m[4:], X, Y)])
    assert np.allclose(delta(result)[0].ravel(), 0.2 * g[:4], atol=1e-6)
    assert np.allclose(delta(result)[1], 0.2 * g[4:], atol=1e-6)


COUNTS = np.array([3.0, 1.0])
SHIFT = 0.1 * COUNTS**-0.25


@pytest.mark.parametrize("quirk", [False, True], ids=["paper", "fedgucci_code"])
def test_fedgucci_plus_is_the_loop_with_calibrated_loss_and_sam_on_every_step(quirk):
    reading = "fedgucci_code" if quirk else "paper"
    result = client("fedgucci_plus", older=[A1], **loop_options(sam={"rho": 0.3}, reading=reading))
    dw, db = reference_client([(W0, B0), A1], epochs=2, shift=SHIFT, rho=0.3, quirk=quirk, **LOOP)
    assert np.allclose(delta(result)[0], dw, atol=1e-6) and np.allclose(delta(result)[1], db, atol=1e-6)
    plain, _ = reference_client([(W0, B0), A1], epochs=2, shift=SHIFT, **LOOP)
    assert not np.allclose(dw, plain, atol=1e-4)  # SAM changed something


def test_fedgucci_plus_joint_is_sam_on_the_whole_objective():
    """One batch: g(v) = grad of the calibrated Eq. 13; w1 = w0 - lr g(w0 + rho g(w0) / ||g(w0)||)."""
    options = {
        "num_anchors": 2,
        "update_mode": "joint",
        "sam": {"rho": 0.3},
        "local": {"lr": 0.2, "batch_size": 4},
    }
    result = client("fedgucci_plus", older=[A1], **options)

    def g(v):
        out = np.concatenate([a.ravel() for a in grad(v[:4].reshape(2, 2), v[4:], X, Y, SHIFT)])
        for aw, ab in [(W0, B0), A1]:
            m = 0.5 * v + 0.5 * np.concatenate([aw.ravel(), ab])
            out += (
                0.1
                * 0.5
                / 2
                * np.concatenate([a.ravel() for a in grad(m[:4].reshape(2, 2), m[4:], X, Y, SHIFT)])
            )
        return out

    v0 = np.concatenate([W0.ravel(), B0])
    g0 = g(v0)
    expected = 0.2 * g(v0 + 0.3 * g0 / np.linalg.norm(g0))
    assert np.allclose(np.concatenate([delta(result)[0].ravel(), delta(result)[1]]), expected, atol=1e-6)


def test_an_adaptive_sam_makes_fedgucci_plus_take_asam_steps():
    """Joint mode, beta 0, no calibration: each step is the ASAM step, so the update is FedASAM's
    (tested against a numpy reference in tests/unit/train/test_sharpness.py), and differs from SAM's."""
    local = {"lr": 0.3, "batch_size": 2, "epochs": 2}
    asam = {"rho": 0.7, "adaptive": True, "eta": 0.2}
    options = {"beta": 0.0, "update_mode": "joint", "logit_calibration": None, "local": local}
    gucci = client("fedgucci_plus", sam=asam, **options)
    fedasam = plugin("fedasam", sam=asam, local=local).client_update(context(X, Y, payload()))
    assert all(torch.equal(gucci.update[k], fedasam.update[k]) for k in ("weight", "bias"))
    sam = client("fedgucci_plus", sam={"rho": 0.7}, **options)
    assert not torch.allclose(sam.update["weight"], gucci.update["weight"], atol=1e-5)


def test_uniform_alpha_is_reproducible_and_differs_from_the_midpoint():
    options = loop_options(alpha_mode="uniform", beta=2.0)
    first, second = client(older=[A1], **options), client(older=[A1], **options)
    assert torch.equal(first.update["weight"], second.update["weight"])
    midpoint = client(older=[A1], **loop_options(beta=2.0))
    assert not torch.allclose(first.update["weight"], midpoint.update["weight"], atol=1e-5)


# ---- buffers at the interpolated point -----------------------------------------------------------

BN_SPEC = DataSpec(task="classification", input_shape=(2,), num_classes=2)


def bn_net():
    """A BN-first model: its running mean depends on the inputs only, not on the weights."""
    torch.manual_seed(0)
    return nn.Sequential(nn.BatchNorm1d(2), nn.Linear(2, 2), nn.Dropout(0.5))


def bn_context(algo, state):
    ctx = context(X, Y, algo.payload(state, 0, INFO))
    ctx = replace(ctx, model=bn_net())
    P.load_into(ctx.model, state.params)
    return ctx


def bn_state(algo):
    params = P.clone(P.model_params(bn_net()))
    params["0.running_mean"] += 0.7  # global statistics unlike the batch's
    keys = frozenset({"0.running_mean", "0.running_var"})
    info = RunInfo(num_clients=2, cohort_size=1, num_rounds=1, spec=BN_SPEC, seed=0, buffer_keys=keys)
    return algo.init(params, info)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_interpolated_pass_leaves_the_running_statistics_to_the_task_pass(mode):
    """One batch: BN's statistics move once (the task pass), as FedAvg's do."""
    local = {"lr": 0.1, "batch_size": 4}
    runs = {}
    for name, options in [("fedavg", {}), ("fedgucci", {"interpolated_mode": mode, "num_anchors": 2})]:
        algo = plugin(name, local=local, **options)
        ctx = bn_context(algo, bn_state(algo))
        algo.client_update(ctx)
        runs[name] = ctx.model[0]
    assert int(runs["fedgucci"].num_batches_tracked) == 1
    assert torch.equal(runs["fedgucci"].running_mean, runs["fedavg"].running_mean)
    assert runs["fedgucci"].training


def test_eval_mode_runs_the_interpolated_pass_with_the_global_buffers():
    """interpolated_mode eval: no dropout, BN normalises with the global running statistics."""
    algo = plugin(interpolated_mode="eval")
    state = bn_state(algo)
    ctx = bn_context(algo, state)
    reference = copy.deepcopy(ctx.model).eval()  # the global model
    with torch.no_grad():
        ctx.model[0].running_mean.add_(1.0)  # live statistics that moved away from the global ones
    conn = algo._connectivity(ctx)
    loss = interpolated(conn, ctx.model, batch_f32(), 0)[0]  # anchor 1 == w: the global model
    expected = F.cross_entropy(reference(batch_f32()["x"]), batch_f32()["y"])
    assert torch.allclose(loss, expected, atol=1e-6) and ctx.model.training


def batch_f32():
    return {"x": torch.tensor(X, dtype=torch.float32), "y": torch.tensor(Y)}


# ---- server: the anchors ring buffer -------------------------------------------------------------


def info():
    return RunInfo(num_clients=4, cohort_size=2, num_rounds=5, spec=SPEC, seed=0)


def test_anchors_are_the_newest_global_models_newest_first(tmp_path):
    algo = plugin(num_anchors=3)
    state = algo.init({"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}, info())
    globals_ = [state.params]
    for t in range(4):
        anchors = state.extra.anchors
        assert len(anchors) == min(3, t + 1)
        for anchor, expected in zip(anchors, reversed(globals_), strict=False):
            assert all(torch.equal(anchor[k], expected[k]) for k in ("weight", "bias"))
        sent = algo.payload(state, t, INFO)
        assert len(sent.extra.anchors) == len(anchors) - 1  # anchor 1 travels as the params
        for older, expected in zip(sent.extra.anchors, anchors[1:], strict=True):
            assert np.array_equal(older["weight"], expected["weight"].numpy())
        mean_delta = {"weight": torch.full((2, 2), 0.1 * (t + 1)), "bias": torch.full((2,), -0.1)}
        state, _ = algo.server_update(state, mean_delta, t, INFO)
        globals_.append(state.params)
    assert torch.allclose(state.extra.anchors[0]["weight"], globals_[-1]["weight"])

    path = save_checkpoint(tmp_path / "ckpt.pt", state, round_num=3, job_dict={})
    loaded, _, _, _ = load_checkpoint(path)  # the plain dict of the Anchors' fields
    kept = from_plain(plugin_types(algo).Anchors, loaded.extra, "the checkpoint's state")
    assert len(kept.anchors) == 3
    for a, b in zip(kept.anchors, state.extra.anchors, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("weight", "bias"))


def test_anchors_hold_the_trainable_tensors_not_the_buffers():
    algo = plugin()
    state = bn_state(algo)
    assert set(state.extra.anchors[0]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert "0.running_mean" in state.params


def parent_trail(tmp_path, last, missing=()):
    """A FedAvg run's per-round checkpoints (no anchors): the model after round r is W0 + r + 1."""
    states = {
        r: plugin("fedavg").init(
            {"weight": torch.tensor(W0).float() + r + 1, "bias": torch.tensor(B0).float() + r + 1}, info()
        )
        for r in range(last + 1)
    }
    for r, state in states.items():
        if r not in missing:
            save_checkpoint(tmp_path / f"round_{r:05d}.pt", state, r, {})
    return CheckpointTrail(tmp_path / f"round_{last:05d}.pt", last, states[last])


def branch_anchors(num_anchors, trail):
    """The anchors (as offsets from W0: 0 is the initial model) of a branch from ``trail``."""
    algo = plugin(num_anchors=num_anchors)
    fresh = algo.init({"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}, info())
    state = algo.resume_state(trail.state, fresh, trail)
    assert state.params is trail.state.params
    return [float(anchor["weight"][0, 0] - W0[0, 0]) for anchor in state.extra.anchors]


def test_a_branch_from_fedavg_takes_the_parents_last_n_models_as_anchors(tmp_path):
    assert branch_anchors(3, parent_trail(tmp_path, 3)) == pytest.approx([4, 3, 2])  # newest first
    assert branch_anchors(1, parent_trail(tmp_path / "alone", 3, missing=(0, 1, 2))) == pytest.approx([4])


def test_a_branch_early_in_the_parent_adds_the_initial_model_as_a_run_from_round_0_has(tmp_path):
    assert branch_anchors(4, parent_trail(tmp_path, 1)) == pytest.approx([2, 1, 0])


def test_a_branch_without_the_parents_earlier_checkpoints_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"round 2 .*checkpoint_every: 1.*num_anchors: 1"):
        branch_anchors(3, parent_trail(tmp_path, 3, missing=(2,)))


def test_a_fedgucci_checkpoint_keeps_its_newest_anchors(tmp_path):
    algo = plugin(num_anchors=2)
    params = {"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}
    saved = replace(algo.init(params, info()), extra=plugin_types(algo).Anchors([params] * 3))
    trail = CheckpointTrail(tmp_path / "round_00007.pt", 7, saved)  # no siblings needed
    assert len(algo.resume_state(saved, algo.init(params, info()), trail).extra.anchors) == 2


def test_an_empty_round_keeps_the_model_and_pushes_it_again():
    algo = plugin(num_anchors=2)
    state = algo.init({"weight": torch.tensor(W0).float(), "bias": torch.tensor(B0).float()}, info())
    after, metrics = algo.server_update(state, None, 0, INFO)
    assert metrics == {} and len(after.extra.anchors) == 2
    assert torch.equal(after.params["weight"], state.params["weight"])


# ---- configuration ---------------------------------------------------------------------------


def test_plus_switches_on_calibration_and_sam():
    plus = registry.get("algorithm", "fedgucci_plus").config()
    base = registry.get("algorithm", "fedgucci").config()
    assert plus.logit_calibration and plus.sam and not (base.logit_calibration or base.sam)
    assert (base.num_anchors, base.beta, base.fixed_alpha, base.update_mode) == (1, 0.1, 0.5, "sequential")


def test_options_that_do_nothing_are_refused():
    config = registry.get("algorithm", "fedgucci").config
    with pytest.raises(ValidationError, match="needs sam set"):
        config.model_validate({"reading": "fedgucci_code"})
    with pytest.raises(ValidationError, match="drop alpha"):
        config.model_validate({"alpha_mode": "uniform", "alpha": 0.3})
    config.model_validate({"alpha_mode": "uniform"})
    assert config.model_validate({"alpha": 0.8}).fixed_alpha == 0.8


@pytest.mark.parametrize("inside_ima", [False, True])
def test_a_uniform_alpha_job_validates_again_from_its_dump(inside_ima):
    """Workers, checkpoints and IMA's inner section validate ``to_dict``'s full dump again."""
    section = {"name": "fedgucci", "alpha_mode": "uniform"}
    algorithm = {"name": "ima", "average_from": 1, "inner": section} if inside_ima else section
    job = validate_job({"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": algorithm})
    again = JobConfig.from_dict(job.to_dict())
    assert again == job
    config = again.algorithm.config.inner.config if inside_ima else again.algorithm.config
    assert config.alpha_mode == "uniform" and config.fixed_alpha is None


def test_calibration_and_sam_take_settings_or_null_not_switches():
    config = registry.get("algorithm", "fedgucci").config
    with pytest.raises(ValidationError, match=r"sam takes its settings, e.g. sam: \{rho: 0.05\}, or null"):
        config.model_validate({"sam": True})
    with pytest.raises(ValidationError, match=r"logit_calibration: \{strength: 0.1\}"):
        config.model_validate({"logit_calibration": False})
    for stale in ({"sam_rho": 0.1}, {"tau": 0.2}):  # the settings live inside the options now
        with pytest.raises(ValidationError, match="Extra inputs"):
            config.model_validate(stale)
    plus = registry.get("algorithm", "fedgucci_plus").config.model_validate(
        {"sam": None, "logit_calibration": {"strength": 0.3}}
    )
    assert plus.sam is None and plus.logit_calibration.strength == 0.3


def test_logit_calibration_needs_a_classification_task():
    spec = DataSpec(task="regression", input_shape=(2,), num_classes=1)
    run = RunInfo(num_clients=2, cohort_size=1, num_rounds=1, spec=spec, seed=0)
    params = {"weight": torch.zeros(1, 2)}
    with pytest.raises(ConfigError, match="logit_calibration"):
        plugin("fedgucci_plus").init(params, run)
    plugin("fedgucci").init(params, run)


def test_a_client_without_data_sends_a_zero_update():
    result = plugin("fedgucci_plus").client_update(context(np.zeros((0, 2)), np.zeros(0), anchors_payload()))
    assert result.weight == 0 and all(float(v.abs().sum()) == 0 for v in result.update.values())
