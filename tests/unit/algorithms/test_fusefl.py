"""FuseFL's client side: what a stage trains, freezes and uploads, and the BatchNorm policy of
the frozen fused blocks (the numbers of the fused forward are checked in tests/unit/models)."""

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from reference import plugin_types

from raysim import params as P
from raysim import registry
from raysim.config.plugins import validate_plugin
from raysim.models import build_model
from raysim.train.local import train_local
from raysim.types import ClientContext, ClientData, DataSpec, RunInfo

SPEC = DataSpec("classification", (3, 8, 8), 3)
SPLITS = ["layer1", "layer2"]  # K = 3 on resnet10: stem+layer1 | layer2 | layer3, layer4, pool

INFO = RunInfo(2, 2, 4, SPEC, seed=0)  # the run's facts


def plugin(**options):
    section = validate_plugin("algorithm", {"name": "fusefl", "splits": SPLITS, **options}, [])
    return registry.get("algorithm", "fusefl").factory(section.config)


def context(algo, model, stage, fused, state, client_id):
    rng = np.random.default_rng(client_id)
    data = ClientData({"x": rng.normal(size=(24, 3, 8, 8)).astype(np.float32), "y": rng.integers(0, 3, 24)})
    payload = algo.payload(replace_state(algo, model, fused), stage, INFO)
    return ClientContext(
        client_id=client_id, round_num=stage, model=model,
        payload=replace(payload, extra=P.to_device(payload.extra, "cpu")),
        global_params={}, data=data, state=state, seed=client_id, device=torch.device("cpu"), spec=SPEC,
    )  # fmt: skip


def replace_state(algo, model, fused):
    state = algo.init(P.model_params(model), RunInfo(2, 2, 4, SPEC, seed=0))
    return replace(state, extra=replace(state.extra, fused=fused))


def two_clients_through_stage_0(algo):
    torch.manual_seed(0)
    model = build_model("resnet10", {"width": 4}, SPEC)
    results = [algo.client_update(context(algo, model, 0, {}, None, c)) for c in (0, 1)]
    fused = {"0": {str(m): r.update.part for m, r in enumerate(results)}}
    return model, fused, results


def test_a_stage_uploads_its_adapter_and_block_and_keeps_the_whole_model():
    algo = plugin()
    model, fused, results = two_clients_through_stage_0(algo)
    first = results[0]
    assert all(name.startswith("block.") for name in first.update.part) and first.update.head == {}
    assert set(first.state.params) == set(model.state_dict())
    stage1 = algo.client_update(context(algo, model, 1, fused, first.state, 0))
    names = set(stage1.update.part)
    assert {"adapter.map.weight", "adapter.map.bias"} <= names  # 1x1 conv, 2 x 4 channels -> 4
    assert stage1.update.part["adapter.map.weight"].shape == (4, 8, 1, 1)
    trained_above = [k for k in stage1.state.params if k.startswith("layers.2")]
    assert any(not torch.equal(stage1.state.params[k], first.state.params[k]) for k in trained_above)
    assert stage1.update.head == {}  # the head travels at the last stage only


@pytest.mark.parametrize("frozen_bn", ["eval", "train"])
def test_frozen_blocks_never_train_and_their_batchnorm_follows_the_policy(frozen_bn):
    algo = plugin(frozen_bn=frozen_bn)
    model, fused, results = two_clients_through_stage_0(algo)
    ctx = context(algo, model, 1, fused, results[0].state, 0)
    client_model = copy.deepcopy(model)
    client_model.load_state_dict(results[0].state.params)
    net = algo.staged_net(ctx, client_model, 1)
    before = {k: v.clone() for k, v in net.lower.state_dict().items()}
    net.train()
    assert net.lower.training == (frozen_bn == "train")
    assert not any(p.requires_grad for p in net.lower.parameters())
    train_local(net, ctx.data, algo.config.local, seed=0, spec=SPEC)
    after = net.lower.state_dict()
    for name, value in before.items():
        if "running" in name:
            assert torch.equal(after[name], value) == (frozen_bn == "eval"), name
        elif value.is_floating_point():
            assert torch.equal(after[name], value), name


def fused_after_all_stages(algo):
    """Two clients through every stage; the server's fused model with the averaged head."""
    model, fused, results = two_clients_through_stage_0(algo)
    for k in range(1, algo.config.num_stages):
        results = [
            algo.client_update(context(algo, model, k, fused, r.state, c)) for c, r in enumerate(results)
        ]
        fused = {**fused, str(k): {str(m): r.update.part for m, r in enumerate(results)}}
    heads = [r.update.head for r in results]
    head = {name: (heads[0][name] + heads[1][name]) / 2 for name in heads[0]}
    server = type(replace_state(algo, model, fused).extra)(fused, head, torch.tensor([0, 1]))
    return model, server, results


@pytest.mark.parametrize("fusion", ["sum", "mean"])
def test_the_averaged_head_reads_the_sum_of_the_towers_features_or_their_mean(fusion):
    """Each client's head trained on one tower's features t_m; the fused model's head (the average
    of the heads, as it is with ``ccvr.enabled: false``) reads the official code's t_0 + t_1 by
    default, or with ``feature_fusion: mean`` (t_0 + t_1) / 2, the scale the heads trained on.
    The clients' CCVR statistics are of the same input."""
    algo = plugin(ccvr={"enabled": False}, **({"feature_fusion": "mean"} if fusion == "mean" else {}))
    model, server, results = fused_after_all_stages(algo)
    info = replace(INFO, model={"name": "resnet10", "width": 4})
    net = build_model("fusefl_fused", algo.fused_section(info, server), SPEC).eval()
    net.load_state_dict(plugin_types(algo).fused_weights(server))
    x = torch.randn(5, 3, 8, 8)
    with torch.no_grad():
        t0, t1 = (t.flatten(1) for t in net.tower_outputs(x))
        head_input = (t0 + t1) / 2 if fusion == "mean" else t0 + t1
        torch.testing.assert_close(net(x), head_input @ server.head["weight"].T + server.head["bias"])
    ctx = context(algo, model, algo.config.num_stages, server.fused, results[0].state, 0)
    ctx = replace(ctx, payload=replace(ctx.payload, extra=replace(ctx.payload.extra, head=server.head)))
    stats = algo.client_update(ctx).update
    with torch.no_grad():
        t0, t1 = (t.flatten(1) for t in net.tower_outputs(torch.as_tensor(ctx.data.arrays["x"])))
    inputs = (t0 + t1) / 2 if fusion == "mean" else t0 + t1
    torch.testing.assert_close(stats.total.sum(0), inputs.double().sum(0), rtol=1e-5, atol=1e-5)
