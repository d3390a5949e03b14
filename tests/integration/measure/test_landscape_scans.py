"""raysim.measure.landscape through the real engine, and the analysis probes in a run.

Expected values come from plain torch on interpolated weights computed here, not from the code
under test.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jobs import tiny_job
from raysim import params as P
from raysim.engine.build import build
from raysim.engine.loop import run
from raysim.measure import landscape as L
from raysim.measure import landscape_plots
from raysim.runtime.builders import build_job_model
from raysim.services import LABELS, MapRequest
from raysim.tracking.tracker import MemoryTracker

CLIENTS = [0, 3, 7]


@pytest.fixture
def engine(tmp_path):
    job = tiny_job()
    engine, state = build(job, MemoryTracker(), None, tmp_path)
    yield job, engine, P.to_numpy(state.params)
    engine.backend.shutdown()


def perturbed(params, seed):
    rng = np.random.default_rng(seed)
    return {k: (v + rng.normal(scale=0.3, size=v.shape)).astype(v.dtype) for k, v in params.items()}


def direct(job, store, weights):
    """CE and accuracy of torch ``weights`` on the pooled test splits of CLIENTS, in plain torch."""
    model = build_job_model(job, store.spec)
    model.load_state_dict(weights, strict=False)
    model.eval()
    arrays = [store.client_data(c, "test").arrays for c in CLIENTS]
    x = torch.as_tensor(np.concatenate([a["x"] for a in arrays]))
    y = torch.as_tensor(np.concatenate([a["y"] for a in arrays]))
    with torch.no_grad():
        logits = model(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).float().mean().item()


def torch_params(params):
    return {k: torch.as_tensor(v, dtype=torch.float64) for k, v in params.items()}


def test_line_and_group_scans_match_plain_torch(engine):
    job, eng, start = engine
    a, b, c = start, perturbed(start, 1), perturbed(start, 2)
    curve = L.line_scan(eng, a, b, alphas=[0.0, 0.25, 1.0], clients=CLIENTS)
    ta, tb, tc = torch_params(a), torch_params(b), torch_params(c)
    for i, alpha in enumerate((0.0, 0.25, 1.0)):
        loss, accuracy = direct(
            job, eng.store, {k: (alpha * ta[k] + (1 - alpha) * tb[k]).float() for k in ta}
        )
        assert curve.loss[i] == pytest.approx(loss, rel=1e-5) and curve.accuracy[i] == pytest.approx(accuracy)
    group = L.group_barrier(eng, [a, b, c], [1.0, 1.0, 2.0], clients=CLIENTS)
    fused = {k: ((ta[k] + tb[k] + 2 * tc[k]) / 4).float() for k in ta}
    own = [direct(job, eng.store, {k: v.float() for k, v in t.items()}) for t in (ta, tb, tc)]
    fused_loss, _ = direct(job, eng.store, fused)
    assert group["fused_loss"] == pytest.approx(fused_loss, rel=1e-5)
    assert group["loss_barrier"] == pytest.approx(
        fused_loss - (own[0][0] + own[1][0] + 2 * own[2][0]) / 4, rel=1e-4
    )


def test_plane_scan_matches_plain_torch(engine, tmp_path):
    job, eng, start = engine
    w1, w2, w3 = start, perturbed(start, 1), perturbed(start, 2)
    scan = L.plane_scan(eng, w1, w2, w3, size=3, clients=CLIENTS)
    keys = sorted(w1)
    flat = [torch.cat([torch_params(w)[k].flatten() for k in keys]) for w in (w1, w2, w3)]
    u = flat[1] - flat[0]
    u = u / u.norm()
    v = (flat[2] - flat[0]) - ((flat[2] - flat[0]) @ u) * u
    v = v / v.norm()
    for i, j in [(0, 0), (1, 2), (2, 1)]:
        point = flat[0] + scan.xs[j] * u + scan.ys[i] * v
        sizes = [w1[k].size for k in keys]
        weights = {k: part.reshape(w1[k].shape).float() for k, part in zip(keys, point.split(sizes))}
        loss, accuracy = direct(job, eng.store, weights)
        assert scan.loss[i, j] == pytest.approx(loss, rel=1e-5)
        assert scan.accuracy[i, j] == pytest.approx(accuracy)
    assert landscape_plots.plot_plane(scan, tmp_path / "plane.png").stat().st_size > 0


def test_map_clients_returns_the_labels_of_the_data(engine):
    _, eng, start = engine
    [labels] = eng.map_clients(MapRequest(LABELS, [start], CLIENTS, split="train"))
    for c, y in zip(CLIENTS, labels):
        np.testing.assert_array_equal(y, eng.store.client_data(c, "train").arrays["y"])


def test_the_analysis_probes_log_finite_values_that_agree(tmp_path):
    """The uniform fusion of all K local models is the group barrier's fused model (with
    ``weights: uniform``) and the decomposition's mean of K models: the same loss on the same
    data, once from ``evaluate`` rows and once from logits scored with the labels."""
    probes = [
        {"name": "group_barrier", "data": "cohort", "weights": "uniform", "pairwise": True, "samples": 2},
        {"name": "loss_decomposition", "data": "cohort"},
    ]
    result = run(tiny_job(evaluation={"probes": probes}, engine={"num_rounds": 2}), output_dir=tmp_path)
    for _, metrics in result.history:
        logged = {k: v for k, v in metrics.items() if k.startswith(("group_barrier/", "decomposition/"))}
        assert len(logged) == 10 + 10 + 2 * 6  # and the cohort of 6: mean_of_1..6, both losses each
        assert all(math.isfinite(v) for v in logged.values())
        assert logged["group_barrier/fused_loss"] == pytest.approx(
            logged["decomposition/variance/mean_of_6/cross_entropy"], rel=1e-5
        )
        assert logged["decomposition/locality/max"] >= logged["decomposition/locality/mean"] > 0
        assert 0 < logged["decomposition/covariance/cka"] <= 1


def test_a_probe_that_needs_a_central_test_set_stops_the_build_before_training():
    """Digits has no central test set: group_barrier's default data: central is refused when the
    run is built, with its fix, not at the probe's first due round."""
    from raysim.engine.build import open_parts
    from raysim.errors import ConfigError

    with pytest.raises(ConfigError, match="group_barrier with data: central.*set data: cohort"):
        open_parts(tiny_job(evaluation={"probes": [{"name": "group_barrier", "every": 2}]}))
