"""raysim.measure.landscape, weight_space, estimators and connectivity_probes against hand values and
independent numpy references.

The scans run on ``LinearServices``, a stand-in for the engine whose "model" is a linear softmax
classifier ``logits = x @ W`` on fixed per-client data; the expected numbers evaluate the
interpolated weights directly in numpy on the concatenated data (pooled means, not the code's
per-client weighting), so a wrong point, order or pooling weight shows.

Hand values:
- a = [1], b = [-1], L(w) = 1 - w^2 (a ridge between the two): w(alpha) = 2 alpha - 1, the end
  losses are 0, so B_loss = max_a 1 - (2a - 1)^2 = 1 at a = 0.5; a convex L = w^2 has none.
- FedGuCci Table 9 (CNN, vanilla): 1 - 11.5 / 64.0 = 0.8203125 at the midpoint.
- Plane: w1 = 0, w2 = (2, 0, 0), w3 = (0, 3, 0) sit at (0, 0), (2, 0), (0, 3); with
  w3 = (1, 1, 0) at (1, 1); with w1 = (1, 1, 1), w2 = w1 + (3, 4, 0), w3 = w1 + (3, 4, 0) + (0, 0, 2)
  at (0, 0), (5, 0), (5, 2).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raysim.errors import ConfigError
from raysim.measure import estimators as E
from raysim.measure import landscape as L
from raysim.measure import landscape_plots, points
from raysim.measure import weight_space as W
from raysim.probe import ProbeRound
from raysim.services import MapRequest
from raysim.types import ClientData, DataSpec, RunInfo

RNG = np.random.default_rng(0)
DIM, CLASSES = 4, 3
CLIENT_DATA = {
    c: (RNG.normal(size=(n, DIM)).astype(np.float32), RNG.integers(0, CLASSES, size=n))
    for c, n in {0: 5, 1: 9, 2: 2}.items()
}
CENTRAL = (RNG.normal(size=(7, DIM)).astype(np.float32), RNG.integers(0, CLASSES, size=7))


def model(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"W": rng.normal(size=(DIM, CLASSES)).astype(np.float32), "steps": np.array(seed, dtype=np.int64)}


def reference(params, data):
    """CE loss and accuracy of ``x @ W`` on ``data`` (x, y), in torch."""
    x, y = data
    logits = torch.as_tensor(x, dtype=torch.float64) @ torch.as_tensor(params["W"], dtype=torch.float64)
    target = torch.as_tensor(y)
    return F.cross_entropy(logits, target).item(), (logits.argmax(-1) == target).double().mean().item()


def pooled(clients):
    return tuple(np.concatenate([CLIENT_DATA[c][i] for c in clients]) for i in (0, 1))


class LinearServices:
    """``map_clients`` for a linear softmax model; records every call."""

    info = RunInfo(3, 3, 1, DataSpec("classification", (DIM,), CLASSES), seed=0)  # no buffers

    def __init__(self):
        self.calls = []

    def map_clients(self, request: MapRequest):
        clients = None if request.clients is None else list(request.clients)
        self.calls.append((request.task.name, len(request.points), clients, request.split))
        datasets = [CENTRAL] if clients is None else [CLIENT_DATA[c] for c in clients]
        return [[self._one(request.task.name, p, data) for data in datasets] for p in request.points]

    @staticmethod
    def _one(task, params, data):
        x, y = data
        logits = x.astype(np.float64) @ params["W"].astype(np.float64)
        if task == "logits":
            return logits
        if task == "labels":
            return y
        return {
            "loss": float(E.cross_entropy(logits, y).mean()),
            "accuracy": float((logits.argmax(-1) == y).mean()),
            "num_examples": float(len(y)),
        }


# ---- parameter arithmetic --------------------------------------------------------------------


def test_interpolate_and_mix_match_numpy_and_keep_integer_entries_of_the_first_model():
    a, b, c = model(1), model(2), model(3)
    np.testing.assert_allclose(W.interpolate(a, b, 0.3)["W"], 0.3 * a["W"] + 0.7 * b["W"], rtol=1e-6)
    np.testing.assert_allclose(W.interpolate(a, b, 1.5)["W"], 1.5 * a["W"] - 0.5 * b["W"], rtol=1e-6)
    assert W.interpolate(a, b, 0.3)["steps"] == 1 and W.interpolate(a, b, 0.3)["W"].dtype == np.float32
    mixed = W.mix([a, b, c], [2, 1, 1])  # normalised: 1/2, 1/4, 1/4
    np.testing.assert_allclose(mixed["W"], 0.5 * a["W"] + 0.25 * b["W"] + 0.25 * c["W"], rtol=1e-6)
    assert mixed["steps"] == 1
    with pytest.raises(ValueError, match="weights must be >= 0"):
        W.mix([a, b], [1, -1])
    with pytest.raises(ValueError, match="2 points need 2 weights"):
        W.mix([a, b], [1])
    with pytest.raises(ValueError, match="other entries"):
        W.interpolate(a, {"V": a["W"], "steps": a["steps"]}, 0.5)


def test_distance_is_the_l2_norm_of_the_flattened_float_entries():
    a = {"x": np.array([1.0, 2.0]), "y": np.array([[2.0]]), "n": np.array(7)}
    b = {"x": np.array([1.0, 0.0]), "y": np.array([[1.0]]), "n": np.array(0)}
    assert W.distance(a, b) == pytest.approx(np.sqrt(4 + 1))


# ---- barriers ----------------------------------------------------------------------------------


def test_a_model_has_no_barrier_with_itself():
    services = LinearServices()
    w = model(4)
    curve = L.line_scan(services, w, w, clients=[0, 1])
    assert L.loss_barrier(curve) == pytest.approx(0, abs=1e-12)
    assert L.accuracy_barrier(curve) == pytest.approx(0, abs=1e-12)
    assert L.accuracy_barrier(curve, reading="fedgucci_code") == pytest.approx(0, abs=1e-12)
    assert L.group_barrier(services, [w, w, w])["loss_barrier"] == pytest.approx(0, abs=1e-12)


def test_loss_barrier_of_quadratics_by_hand():
    alphas = np.linspace(0, 1, 11)
    w = 2 * alphas - 1
    assert L.loss_barrier(L.Curve(alphas, 1 - w**2, np.ones(11))) == pytest.approx(1.0)  # a ridge
    assert L.loss_barrier(L.Curve(alphas, w**2, np.ones(11))) == 0.0  # convex: below the chord


def test_table_9_midpoint_arithmetic():
    """Individual accuracies 60% and 68% (mean 64%), midpoint 11.5%: 1 - 11.5/64 = 0.8203125."""
    curve = L.Curve(np.array([0.0, 0.5, 1.0]), np.zeros(3), np.array([0.68, 0.115, 0.60]))
    assert L.accuracy_barrier(curve) == pytest.approx(0.8203125)
    assert L.accuracy_barrier(curve, reading="fedgucci_code") == pytest.approx(0.8203125)


def test_accuracy_barriers_lie_in_the_unit_interval():
    rng = np.random.default_rng(5)
    alphas = np.linspace(0, 1, 11)
    for _ in range(200):
        accuracy = rng.uniform(0, 1, size=11) * rng.integers(0, 2, size=11)  # zeros included
        curve = L.Curve(alphas, rng.normal(size=11), accuracy)
        for reading in ("paper", "fedgucci_code"):
            assert 0.0 <= L.accuracy_barrier(curve, reading=reading) <= 1.0


def test_the_code_variant_reports_the_ratio_at_the_largest_drop():
    """Ends 0.1 (alpha 0) and 0.9 (alpha 1): the line is 0.3 at alpha .25 and 0.5 at .5. Accuracy
    0.05 and 0.2 there drops by .25 (ratio .833) and .3 (ratio .6): the paper's max ratio is .833,
    the code's largest drop reports .6."""
    alphas = np.array([0.0, 0.25, 0.5, 1.0])
    curve = L.Curve(alphas, np.zeros(4), np.array([0.1, 0.05, 0.2, 0.9]))
    assert L.accuracy_barrier(curve) == pytest.approx(0.25 / 0.3)
    assert L.accuracy_barrier(curve, reading="fedgucci_code") == pytest.approx(0.3 / 0.5)


def test_barriers_need_both_endpoints_and_ignore_alphas_outside_the_segment():
    with pytest.raises(ValueError, match="alpha=0 and alpha=1"):
        L.loss_barrier(L.Curve(np.array([0.0, 0.5]), np.zeros(2), np.ones(2)))
    alphas = np.array([-0.5, 0.0, 0.5, 1.0, 1.5])
    curve = L.Curve(alphas, np.array([9.0, 1.0, 1.5, 1.0, 9.0]), np.array([0, 1, 1, 1, 0.0]))
    assert L.loss_barrier(curve) == pytest.approx(0.5) and L.accuracy_barrier(curve) == 0


# ---- scans through a stand-in engine --------------------------------------------------------------


def test_line_scan_evaluates_the_interpolated_models_in_one_call_pooling_the_clients():
    services = LinearServices()
    a, b = model(1), model(2)
    alphas = np.array([0.0, 0.3, 1.0])
    curve = L.line_scan(services, a, b, alphas=alphas, clients=[0, 1, 2], split="train")
    assert services.calls == [("evaluate", 3, [0, 1, 2], "train")]
    for i, alpha in enumerate(alphas):
        loss, accuracy = reference({"W": alpha * a["W"] + (1 - alpha) * b["W"]}, pooled([0, 1, 2]))
        assert curve.loss[i] == pytest.approx(loss, rel=1e-5)
        assert curve.accuracy[i] == pytest.approx(accuracy)
    central = L.line_scan(services, a, b, alphas=[0.5])
    assert central.loss[0] == pytest.approx(reference(W.interpolate(a, b, 0.5), CENTRAL)[0], rel=1e-5)


def test_group_barrier_against_direct_evaluation_uniform_and_weighted():
    services = LinearServices()
    models = [model(s) for s in (1, 2, 3)]
    for weights in (None, [1.0, 3.0, 4.0]):
        lam = np.ones(3) / 3 if weights is None else np.array(weights) / 8
        out = L.group_barrier(services, models, weights, clients=[0, 2])
        fused = {"W": sum(k * m["W"] for k, m in zip(lam, models))}
        fused_loss, fused_accuracy = reference(fused, pooled([0, 2]))
        own = [reference(m, pooled([0, 2])) for m in models]
        mean_loss, mean_accuracy = lam @ [o[0] for o in own], lam @ [o[1] for o in own]
        assert out["loss_barrier"] == pytest.approx(fused_loss - mean_loss, rel=1e-5)
        assert out["accuracy_barrier"] == pytest.approx(1 - fused_accuracy / mean_accuracy)
        assert out["fused_accuracy"] == pytest.approx(fused_accuracy)
        assert out["mean_local_loss"] == pytest.approx(mean_loss, rel=1e-5)


def test_group_barrier_monte_carlo_max_is_at_least_the_barrier_of_each_draw():
    services = LinearServices()
    models = [model(s) for s in (1, 2, 3)]
    out = L.group_barrier(services, models, clients=[1], samples=5, seed=(0, 1))
    draws = np.random.default_rng((0, 1)).dirichlet(np.ones(3), size=5)
    expected = max(L.group_barrier(services, models, d, clients=[1])["loss_barrier"] for d in draws)
    assert out["loss_barrier_max"] == pytest.approx(expected)
    assert services.calls[0] == ("evaluate", 3 + 1 + 5, [1], "test")  # one call for everything


def test_a_scan_without_data_names_the_fix():
    class NoCentral(LinearServices):
        def map_clients(self, request):
            return [[None] for _ in request.points]

    with pytest.raises(points.NoExamplesError, match="central test set.*pass clients"):
        L.line_scan(NoCentral(), model(1), model(2))


# ---- the plane ---------------------------------------------------------------------------------


def split_vector(v, steps=0):
    """A 3-vector as two entries plus an integer buffer, to check flattening across keys."""
    v = np.asarray(v, dtype=np.float32)
    return {"a": v[:2].copy(), "b": v[2:].reshape(1, 1).copy(), "n": np.array(steps)}


@pytest.mark.parametrize(
    ("w1", "w2", "w3", "coords"),
    [
        ([0, 0, 0], [2, 0, 0], [0, 3, 0], [[0, 0], [2, 0], [0, 3]]),  # w3 orthogonal
        ([0, 0, 0], [2, 0, 0], [1, 1, 0], [[0, 0], [2, 0], [1, 1]]),
        ([1, 1, 1], [4, 5, 1], [4, 5, 3], [[0, 0], [5, 0], [5, 2]]),
    ],
)
def test_plane_coordinates_by_hand_and_back_to_the_models(w1, w2, w3, coords):
    models = [split_vector(w, steps=i) for i, w in enumerate((w1, w2, w3))]
    plane = L.Plane.through(*models)
    np.testing.assert_allclose(plane.coords, coords, atol=1e-6)
    for (x, y), m in zip(plane.coords, models):
        back = plane.point(x, y)
        for key in ("a", "b"):
            np.testing.assert_allclose(back[key], m[key], atol=1e-6)
            assert back[key].dtype == np.float32
        assert back["n"] == 0  # integer entries from w1


def test_plane_grid_pads_the_bounding_box_of_the_models():
    plane = L.Plane.through(split_vector([0, 0, 0]), split_vector([2, 0, 0]), split_vector([1, 4, 0]))
    xs, ys = plane.grid(size=5, padding=0.5)
    np.testing.assert_allclose(xs, np.linspace(-1, 3, 5))
    np.testing.assert_allclose(ys, np.linspace(-2, 6, 5))


def test_degenerate_planes_are_refused():
    with pytest.raises(ValueError, match="same point"):
        L.Plane.through(split_vector([1, 0, 0]), split_vector([1, 0, 0]), split_vector([0, 1, 0]))
    with pytest.raises(ValueError, match="on the line"):
        L.Plane.through(split_vector([0, 0, 0]), split_vector([1, 0, 0]), split_vector([3, 0, 0]))


def test_plane_scan_evaluates_each_grid_point_row_by_row_in_one_call():
    services = LinearServices()
    w1, w2, w3 = model(1), model(2), model(3)
    scan = L.plane_scan(services, w1, w2, w3, size=4, padding=0.2, clients=[0, 1], labels=("a", "b", "c"))
    assert services.calls == [("evaluate", 16, [0, 1], "test")]
    assert scan.loss.shape == scan.accuracy.shape == (4, 4) and scan.labels == ("a", "b", "c")
    # the plane by hand: Gram-Schmidt on the flattened W
    origin, du, dw = w1["W"].ravel(), (w2["W"] - w1["W"]).ravel(), (w3["W"] - w1["W"]).ravel()
    u = du / np.linalg.norm(du)
    v = (dw - (dw @ u) * u) / np.linalg.norm(dw - (dw @ u) * u)
    for i, j in [(0, 0), (1, 2), (3, 1)]:
        weights = origin + scan.xs[j] * u + scan.ys[i] * v
        loss, accuracy = reference({"W": weights.reshape(DIM, CLASSES)}, pooled([0, 1]))
        assert scan.loss[i, j] == pytest.approx(loss, rel=1e-5)
        assert scan.accuracy[i, j] == pytest.approx(accuracy)
    chunked = L.plane_scan(
        LinearServices(), w1, w2, w3, size=4, padding=0.2, clients=[0, 1], points_per_call=5
    )
    np.testing.assert_allclose(chunked.loss, scan.loss)


def test_plane_scan_sends_the_grid_in_calls_that_fit_the_memory_budget(monkeypatch):
    """16 points of 56 bytes (W: 12 float32, steps: one int64) under a 300-byte budget: calls of
    five points, the same numbers as one call; the origin is flattened once, not per point."""
    w1, w2, w3 = model(1), model(2), model(3)
    whole = L.plane_scan(LinearServices(), w1, w2, w3, size=4, clients=[0, 1], points_per_call=16)
    monkeypatch.setattr(points, "SCAN_BYTES_PER_CALL", 300)
    flattened = []
    monkeypatch.setattr(L, "flatten", lambda params, real=L.flatten: flattened.append(1) or real(params))
    services = LinearServices()
    chunked = L.plane_scan(services, w1, w2, w3, size=4, clients=[0, 1])
    assert [n for _, n, _, _ in services.calls] == [5, 5, 5, 1]
    np.testing.assert_allclose(chunked.loss, whole.loss)
    assert len(flattened) == 3 + 1  # Plane.through's three, then the origin once for 16 points


class RecordingServices:
    """Records the points a scan sends; ``b`` is a float buffer (a BatchNorm running variance)."""

    info = RunInfo(3, 3, 1, DataSpec("classification", (3,), 2), seed=0, buffer_keys=frozenset({"b"}))

    def __init__(self):
        self.points = []

    def map_clients(self, request):
        self.points += request.points
        return [[{"loss": 0.0, "accuracy": 0.0, "num_examples": 1.0}] for _ in request.points]


@pytest.mark.parametrize(
    ("buffers", "expected"),
    [
        ("clamp", [4.0, 4.0, 2.5, 1.0, 1.0]),  # b(alpha) = 4 - 3 alpha with alpha clipped to [0, 1]
        ("interpolate", [5.5, 4.0, 2.5, 1.0, -0.5]),  # negative past a: NaN under BatchNorm
        ("first", [1.0] * 5),
    ],
)
def test_line_scan_buffers_are_never_extrapolated_by_default(buffers, expected):
    a, b = split_vector([1, 1, 1]), split_vector([3, 0, 4])
    services = RecordingServices()
    L.line_scan(services, a, b, alphas=[-0.5, 0.0, 0.5, 1.0, 1.5], buffers=buffers)
    assert [float(p["b"][0, 0]) for p in services.points] == pytest.approx(expected)
    for alpha, p in zip([-0.5, 0.0, 0.5, 1.0, 1.5], services.points):  # the weights extrapolate
        np.testing.assert_allclose(p["a"], alpha * a["a"] + (1 - alpha) * b["a"], atol=1e-6)


def test_plane_scan_buffers_follow_the_barycentric_weights_clamped_to_the_triangle():
    """w1 = (1, 1, 1), w2 = (4, 5, 1), w3 = (4, 5, 3) sit at (0, 0), (5, 0), (5, 2), so
    (x, y) = l2 (5, 0) + l3 (5, 2): l3 = y / 2, l2 = x / 5 - y / 2, l1 = 1 - x / 5. The buffer
    ``b`` (1, 1, 3 at the models) is sum_k l_k b_k with negative l_k set to 0 and l renormalised."""
    models = [split_vector(w) for w in ([1, 1, 1], [4, 5, 1], [4, 5, 3])]
    services = RecordingServices()
    scan = L.plane_scan(services, *models, size=5, padding=0.5)
    coords = [(x, y) for y in scan.ys for x in scan.xs]
    outside = 0
    for (x, y), p in zip(coords, services.points):
        lam = np.array([1 - x / 5, x / 5 - y / 2, y / 2])
        outside += bool((lam < 0).any())
        clamped = np.clip(lam, 0, None) / np.clip(lam, 0, None).sum()
        assert float(p["b"][0, 0]) == pytest.approx(clamped @ [1.0, 1.0, 3.0])
        np.testing.assert_allclose(p["a"], sum(weight * m["a"] for weight, m in zip(lam, models)), atol=1e-5)
    assert outside > 0  # the padded grid leaves the triangle
    np.testing.assert_allclose(L.Plane.through(*models).barycentric(5.0, 1.0), [0.0, 0.5, 0.5], atol=1e-12)


def test_plots_are_written(tmp_path):
    services = LinearServices()
    curve = L.line_scan(services, model(1), model(2), alphas=np.linspace(-0.5, 1.5, 9), clients=[1])
    scan = L.plane_scan(services, model(1), model(2), model(3), size=5, clients=[1])
    for path in (
        landscape_plots.plot_curve(curve, tmp_path / "curve.png", title="two models"),
        landscape_plots.plot_plane(scan, tmp_path / "deep" / "plane.png", title="three models"),
    ):
        assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


class RegressionServices(LinearServices):
    """A linear regressor ``x @ W[:, 0]`` of the labels, rows as ``evaluate`` gives them: MSE,
    Pearson's r with its summed moments, no accuracy."""

    info = RunInfo(3, 3, 1, DataSpec("regression", (DIM,), 1, metrics=("pearson",)), seed=0)

    @staticmethod
    def _one(task, params, data):
        x, y = data
        p, t = x.astype(np.float64) @ params["W"][:, 0].astype(np.float64), y.astype(np.float64)
        moments = (len(t), p.sum(), t.sum(), p @ p, t @ t, p @ t)
        r = np.corrcoef(p, t)[0, 1] if t.std() > 0 else 0.0  # one label value: r is 0 by convention
        return {"loss": float(np.mean((p - t) ** 2)), "pearson": float(r)} | {
            "num_examples": float(len(t)),
            **{f"sums/moments/{k}": float(v) for k, v in zip(("n", "x", "y", "xx", "yy", "xy"), moments)},
        }


def test_a_regression_scan_pools_pearson_over_the_clients_and_has_no_accuracy(tmp_path):
    """Pearson's r of the pooled examples, not the mean of the clients' r (np.corrcoef on the
    concatenated data); no accuracy, so no accuracy barrier and no error panel."""
    from raysim.cli.analyze import barrier_metrics

    services, clients = RegressionServices(), [0, 1, 2]
    a, b, c = model(1), model(2), model(3)
    x, y = pooled(clients)

    def pearson(w):
        return np.corrcoef(x.astype(np.float64) @ w[:, 0].astype(np.float64), y)[0, 1]

    curve = L.line_scan(services, a, b, alphas=[0.0, 0.5, 1.0], clients=clients)
    assert curve.accuracy is None and set(curve.scores) == {"pearson"}
    for alpha, value in zip(curve.alphas, curve.scores["pearson"]):
        assert value == pytest.approx(pearson(W.interpolate(a, b, alpha)["W"]), rel=1e-9)
    with pytest.raises(ValueError, match="no accuracy"):
        L.accuracy_barrier(curve)
    assert barrier_metrics(curve, "k") == {"k/loss_barrier": L.loss_barrier(curve)}
    group = L.group_barrier(services, [a, b], clients=clients)
    assert not any("accuracy" in key for key in group)
    assert group["fused_pearson"] == pytest.approx(pearson(W.mix([a, b], [1, 1])["W"]), rel=1e-9)
    assert group["mean_local_pearson"] == pytest.approx((pearson(a["W"]) + pearson(b["W"])) / 2, rel=1e-9)
    scan = L.plane_scan(services, a, b, c, size=3, clients=clients)
    assert scan.accuracy is None and scan.scores["pearson"].shape == (3, 3)
    assert landscape_plots.plot_curve(curve, tmp_path / "curve.png").stat().st_size > 0
    assert landscape_plots.plot_plane(scan, tmp_path / "plane.png").stat().st_size > 0


# ---- IMA's output estimators ---------------------------------------------------------------------


def test_squared_error_and_cross_entropy_match_direct_formulas():
    logits = RNG.normal(size=(6, 4)) * 3
    labels = np.array([0, 1, 2, 3, 0, 1])
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(E.squared_error(logits, labels), ((p - np.eye(4)[labels]) ** 2).sum(axis=1))
    expected = F.cross_entropy(torch.as_tensor(logits), torch.as_tensor(labels), reduction="none").numpy()
    np.testing.assert_allclose(E.cross_entropy(logits, labels), expected, rtol=1e-10)
    big = np.array([[1000.0, 0.0]])  # stable: no overflow
    assert E.cross_entropy(big, np.array([1]))[0] == pytest.approx(1000.0)


def test_output_spread_is_the_variance_term_of_the_bias_variance_identity():
    """IMA eq. (2), finite form: mean_k ||p_k - y||^2 = ||p_bar - y||^2 + spread."""
    logits = [RNG.normal(size=(8, 3)) for _ in range(4)]
    onehot = np.eye(3)[RNG.integers(0, 3, size=8)]
    probs = [np.exp(z) / np.exp(z).sum(axis=1, keepdims=True) for z in logits]
    mean_error = np.mean([((p - onehot) ** 2).sum(axis=1).mean() for p in probs])
    bias = ((np.mean(probs, axis=0) - onehot) ** 2).sum(axis=1).mean()
    assert E.output_spread(logits) == pytest.approx(mean_error - bias)


def hsic_cka(x, y):
    """CKA from HSIC with the centring matrix H (Kornblith et al., eq. 3-4)."""
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, l_ = x @ x.T, y @ y.T

    def hsic(a, b):
        return np.trace(a @ h @ b @ h) / (n - 1) ** 2

    return hsic(k, l_) / np.sqrt(hsic(k, k) * hsic(l_, l_))


def test_linear_cka_matches_the_hsic_formula_and_its_invariances():
    x, y = RNG.normal(size=(20, 5)), RNG.normal(size=(20, 3))
    assert E.linear_cka(x, y) == pytest.approx(hsic_cka(x, y))
    rotation, _ = np.linalg.qr(RNG.normal(size=(5, 5)))
    assert E.linear_cka(x, 3 * x @ rotation + 7) == pytest.approx(1.0)
    z = RNG.normal(size=(20, 4))
    expected = np.mean([hsic_cka(x[:, :4], y), hsic_cka(x[:, :4], z), hsic_cka(y, z)])
    assert E.mean_pairwise_cka([x[:, :4], y, z]) == pytest.approx(expected)


# ---- the probes' driver and worker halves ---------------------------------------------------------


class ProbeServices(LinearServices):
    info = RunInfo(
        num_clients=3, cohort_size=3, num_rounds=1, spec=DataSpec("classification", (DIM,), CLASSES), seed=7
    )


def probe_round(sizes):
    """Clients 0, 1, 2 with local models and ``num_examples`` rows (any numbers: the weights)."""
    rows = [
        {
            "client_id": float(c),
            "num_examples": n,
            "train_squared_error": 0.1 * c,
            "train_cross_entropy": 1.0 + c,
        }
        for c, n in enumerate(sizes)
    ]
    models = {c: model(10 + c) for c in range(3)}
    return ProbeRound(round_num=4, rows=rows, broadcast={}, global_params={}, local_models=models)


def test_group_barrier_probe_measures_the_data_weighted_fusion_on_the_cohort_data():
    from raysim.measure.connectivity import GroupBarrier, GroupBarrierConfig

    services = ProbeServices()
    round_view = probe_round([1.0, 2.0, 5.0])
    probe = GroupBarrier(GroupBarrierConfig(data="cohort", pairwise=True))
    out = probe.summarize(round_view, services)
    models = [round_view.local_models[c] for c in range(3)]
    lam = np.array([1.0, 2.0, 5.0]) / 8
    data = pooled([0, 1, 2])
    fused_loss, fused_accuracy = reference({"W": sum(k * m["W"] for k, m in zip(lam, models))}, data)
    own = [reference(m, data) for m in models]
    assert out["group_barrier/loss_barrier"] == pytest.approx(
        fused_loss - lam @ [o[0] for o in own], rel=1e-5
    )
    assert out["group_barrier/accuracy_barrier"] == pytest.approx(
        1 - fused_accuracy / (lam @ [o[1] for o in own])
    )
    assert out["group_barrier/mean_local_accuracy"] == pytest.approx(lam @ [o[1] for o in own])
    mid_loss, mid_accuracy = reference({"W": (models[0]["W"] + models[1]["W"]) / 2}, data)
    assert out["group_barrier/pairwise_loss_barrier"] == pytest.approx(
        mid_loss - (own[0][0] + own[1][0]) / 2, rel=1e-5
    )
    assert out["group_barrier/pairwise_accuracy_barrier"] == pytest.approx(
        1 - 2 * mid_accuracy / (own[0][1] + own[1][1])
    )
    assert services.calls[0] == ("evaluate", 4, [0, 1, 2], "round")
    assert sorted(out) == [  # the vocabulary docs/analysis.md lists
        f"group_barrier/{key}"
        for key in (
            "accuracy_barrier", "fused_accuracy", "fused_loss", "loss_barrier", "mean_local_accuracy",
            "mean_local_loss", "pairwise_accuracy_barrier", "pairwise_loss_barrier",
        )
    ]  # fmt: skip


def test_loss_decomposition_probe_against_direct_numpy():
    """Cohort data: HeterBias of model k on the other clients' data only; the mean of all K
    models is the uniform average whichever subset is drawn."""
    from raysim.measure.connectivity import LossDecomposition, LossDecompositionConfig

    services = ProbeServices()
    round_view = probe_round([1.0, 1.0, 2.0])
    out = LossDecomposition(LossDecompositionConfig(data="cohort", cka_examples=10)).summarize(
        round_view, services
    )
    models = [round_view.local_models[c]["W"].astype(np.float64) for c in range(3)]
    fused = (models[0] + models[1] + 2 * models[2]) / 4
    x, y = pooled([0, 1, 2])
    assert out["decomposition/train_bias/squared_error"] == pytest.approx(0.1)  # the rows' mean
    assert out["decomposition/train_bias/cross_entropy"] == pytest.approx(2.0)
    heter = []
    for k in range(3):
        xo, yo = pooled([c for c in range(3) if c != k])
        heter.append(reference({"W": models[k]}, (xo, yo))[0])
    assert out["decomposition/heter_bias/cross_entropy"] == pytest.approx(np.mean(heter), rel=1e-6)
    probs = [np.exp(x @ w) / np.exp(x @ w).sum(axis=1, keepdims=True) for w in (*models, fused)]
    assert out["decomposition/fused/squared_error"] == pytest.approx(
        ((probs[3] - np.eye(CLASSES)[y]) ** 2).sum(1).mean()
    )
    average = reference({"W": sum(models) / 3}, (x, y))[0]
    assert out["decomposition/variance/mean_of_3/cross_entropy"] == pytest.approx(average, rel=1e-6)
    singles = [reference({"W": w}, (x, y))[0] for w in models]
    assert min(abs(out["decomposition/variance/mean_of_1/cross_entropy"] - s) for s in singles) < 1e-6
    spread = np.mean([((p - np.mean(probs[:3], axis=0)) ** 2).sum(1) for p in probs[:3]])
    assert out["decomposition/variance/spread"] == pytest.approx(spread)
    distances = [np.linalg.norm(w - fused) for w in models]
    assert out["decomposition/locality/max"] == pytest.approx(max(distances), rel=1e-5)
    assert out["decomposition/locality/mean"] == pytest.approx(np.mean(distances), rel=1e-5)
    # CKA on 10 of the 16 pooled examples drawn with the probe's documented seed (run seed 7,
    # round 4), not the first 10
    rows = np.sort(np.random.default_rng((7, 4, 0xC4A)).choice(16, 10, replace=False))
    assert not np.array_equal(rows, np.arange(10))
    logits = [x[rows] @ w for w in models]
    pairs = [hsic_cka(logits[i], logits[j]) for i, j in ((0, 1), (0, 2), (1, 2))]
    assert out["decomposition/covariance/cka"] == pytest.approx(np.mean(pairs))


def test_loss_decomposition_worker_hook_scores_the_local_model_on_its_round_data():
    from raysim.measure.connectivity import LossDecomposition, LossDecompositionConfig
    from raysim.probe import ClientView

    x, y = CLIENT_DATA[1]
    net = torch.nn.Linear(DIM, CLASSES)
    view = ClientView(1, 0, net, ClientData({"x": x, "y": y}), evaluate=None, test_data=None)
    with torch.no_grad():
        row = LossDecomposition(LossDecompositionConfig()).after_training(view)
        logits = net(torch.as_tensor(x))
    probs = logits.softmax(-1).numpy()
    assert row["num_examples"] == len(y)
    assert row["train_squared_error"] == pytest.approx(
        ((probs - np.eye(CLASSES)[y]) ** 2).sum(1).mean(), rel=1e-5
    )
    assert row["train_cross_entropy"] == pytest.approx(
        F.cross_entropy(logits, torch.as_tensor(y)).item(), rel=1e-5
    )


def test_loss_decomposition_leaves_out_a_client_without_round_examples():
    """Partitions may leave a client empty (min_size 0): its hook reports only its size, and the
    summary is that of the clients that trained (its model, the broadcast, takes no part)."""
    from raysim.measure.connectivity import LossDecomposition, LossDecompositionConfig
    from raysim.probe import ClientView

    empty = ClientData({"x": np.zeros((0, DIM), np.float32), "y": np.zeros(0, np.int64)})
    view = ClientView(3, 0, torch.nn.Linear(DIM, CLASSES), empty, evaluate=None, test_data=None)
    with torch.no_grad():
        assert LossDecomposition(LossDecompositionConfig()).after_training(view) == {"num_examples": 0.0}

    class WithEmptyClient(ProbeServices):
        def map_clients(self, request):
            if request.clients is None or 3 not in request.clients:
                return super().map_clients(request)
            out = super().map_clients(replace(request, clients=[c for c in request.clients if c != 3]))
            return [[*rows, None] for rows in out]  # the engine's None: no examples

    full = probe_round([1.0, 1.0, 2.0])
    rows = [*full.rows, {"client_id": 3.0, "num_examples": 0.0}]
    with_empty = ProbeRound(4, rows, {}, {}, local_models=full.local_models | {3: model(99)})
    for data in ("cohort", "central"):
        probe = LossDecomposition(LossDecompositionConfig(data=data, cka_examples=10))
        expected = probe.summarize(full, ProbeServices())
        got = probe.summarize(with_empty, WithEmptyClient())
        assert got.keys() == expected.keys() and all(np.isfinite(v) for v in got.values())
        assert got == pytest.approx(expected)


def test_the_probes_refuse_a_run_they_cannot_measure_before_it_trains():
    """``check`` (called by build): data: central without a central test set, and IMA's
    decomposition on a regression task, each named with its fix; check_probes gathers them all."""
    from raysim.measure.barrier import LocalAccuracy
    from raysim.measure.connectivity import (
        GroupBarrier,
        GroupBarrierConfig,
        LossDecomposition,
        LossDecompositionConfig,
    )
    from raysim.probe import ProbeConfig, check_probes

    no_central = RunInfo(3, 3, 1, DataSpec("classification", (DIM,), CLASSES), seed=0, has_central_test=False)
    for probe in (GroupBarrier(GroupBarrierConfig()), LossDecomposition(LossDecompositionConfig())):
        with pytest.raises(ConfigError, match="central test set.*set data: cohort"):
            probe.check(no_central)
        probe.check(ProbeServices.info)  # a central test set: fine
    GroupBarrier(GroupBarrierConfig(data="cohort")).check(no_central)
    regression = RunInfo(3, 3, 1, DataSpec("regression", (DIM,), 1), seed=0, has_central_test=False)
    with pytest.raises(ConfigError) as refused:
        check_probes(
            {
                "local_accuracy": LocalAccuracy(ProbeConfig()),  # no check hook: nothing to refuse
                "group_barrier": GroupBarrier(GroupBarrierConfig()),
                "loss_decomposition": LossDecomposition(LossDecompositionConfig(data="cohort")),
            },
            regression,
        )
    assert len(refused.value.problems) == 2
    assert "group_barrier with data: central" in refused.value.problems[0]
    assert "loss_decomposition needs a classification dataset, not regression" in refused.value.problems[1]
    assert GroupBarrier(GroupBarrierConfig()).summarize(ProbeRound(0, [], {}, {}), ProbeServices()) == {}


def test_the_variance_curve_takes_the_sizes_asked_for():
    from raysim.measure.connectivity import LossDecomposition, LossDecompositionConfig

    config = LossDecompositionConfig(data="cohort", mean_of=[1, 3, 9], subsets=2)
    out = LossDecomposition(config).summarize(probe_round([1.0, 1.0, 1.0]), ProbeServices())
    assert sorted(k for k in out if "mean_of" in k) == [
        f"decomposition/variance/mean_of_{j}/{form}"
        for j in (1, 3)
        for form in ("cross_entropy", "squared_error")
    ]
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        LossDecompositionConfig(mean_of=[0])
