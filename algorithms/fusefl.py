"""FuseFL: one-shot-cost FL by progressive model fusion (Tang et al., NeurIPS 2024,
arXiv:2410.20380; docs/papers.md section 5).

The client model (the job's ``model``, narrowed by the job: width 32 for M = 5) is cut at
``splits`` into K = len(splits) + 1 stages (by default K = 2, after the middle block). Stage k
(0-based, step k; every client, whatever ``engine.num_rounds`` and ``cohort_size`` say) trains, on
every client, a fresh adapter, block k and everything above it on top of the fused, frozen blocks
0..k-1; each client uploads its adapter and block k (and its head at the last stage), and the
server fuses block k by placing the M uploads side by side in client-id order
(``raysim.models.fused``). Between stages a client keeps its own model (warm-started upper blocks,
head) as client state. After the last stage the heads are averaged and calibrated with CCVR on
every client's features of the fused model (one more round, ``raysim.train.ccvr``), and the
fused model is evaluated on the workers as the registered model ``fusefl_fused``.

The fused head reads the M towers' top features joined by ``feature_fusion``: summed, as the
official code does (the paper says "averaging and calibrating", Algorithm 1 line 12), M times the
scale each client's head trained on, or their mean, that scale. The sum is the default: CCVR
retrains the head on it with SGD at the local lr, tuned to that scale (the mean calibrates more
slowly and ends lower). With ``ccvr.enabled: false`` the averaged head is used as it is, and it is
weak whatever the scale, which moves its predictions only through its bias: each client's head
trained on its own tower's features, and the average applies every head to every tower's
(docs/papers.md section 5 has the numbers).

Every client starts from the run's initial model (the official code's shared block init; its
heads are initialised apart, here they start equal too; the paper is silent). Frozen fused blocks
never train; ``frozen_bn`` says what their BatchNorm layers do: "eval" (the
default; normalise with the running statistics as uploaded; the paper says only "freeze") or "train" (the
official code's: batch statistics, the client's copy's running statistics overwritten).

Logged per stage (step k): the stage's cohort metrics (``services.round_metrics``): the clients'
``train/*`` means, ``sys/bytes_up`` (adapters and blocks, the heads at the last stage),
``sys/bytes_down`` (the fused blocks sent to every client; the initial model at stage 0) and per
payload part; then at step K ``ccvr/*`` (the statistics' bytes, the calibration loss), the
fused model's ``eval/central/*`` and ``eval/clients/*`` as the job's evaluation plan gives a
global model's (``services.evaluate_weights``), ``fusefl/params`` and ``fusefl/mib`` (|F_fus|,
parameters, MiB of float32 as Table 4) and ``fusefl/paper_comm_mib`` (M x |F_fus|, Table 13's convention).

Per-client architectures (the ResNet-10/18/26 mix of the FuseFL paper, Sec. 6.2, Table 3): a job's
``model_groups`` give clients different model sections; tower m is client m's architecture
(``ctx.model_of``), and conv1x1 adapters read the sum of the towers' channels. The split points must
align (the same number of stages, the same spatial sizes at every split, one feature size at the
top): ``check_models`` says what does not, on the driver before any worker starts. Each client then
starts from its own architecture's initial model, built from the run seed on every worker (the
official code's shared init), so stage 0 sends no parameters (``sys/bytes_down`` 0 at step 0).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, model_validator
from torch import nn

from raysim import params as P
from raysim.aggregate import Gathered
from raysim.errors import ConfigError
from raysim.models.anatomy import parts
from raysim.models.fused import (
    AdapterKind,
    FeatureFusion,
    FrozenBN,
    FusedPart,
    FusedStages,
    StagedNet,
    client_stages,
    fused_net,
    fused_parts,
    make_adapter,
    split_points,
    stage_output_shapes,
    tower_misfits,
    tower_models,
    tower_shapes,
)
from raysim.registry import register
from raysim.services import Services
from raysim.train.batching import iterate_batches, to_tensors
from raysim.train.ccvr import CCVRConfig, FeatureStats, calibrated_head, class_statistics
from raysim.train.local import LocalTrainConfig, train_context
from raysim.train.server_opt import init_state
from raysim.types import (
    ClientContext,
    ClientResult,
    DataSpec,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
)

Fused = dict[str, dict[str, Params]]  # stage k -> tower m (position among sorted client ids) -> part


class FuseFLConfig(BaseModel, frozen=True, extra="forbid"):
    """FuseFL: K stages of training on the fused frozen lower blocks, then CCVR."""

    local: LocalTrainConfig = LocalTrainConfig()  # per stage: E / K epochs (FuseFL paper, Sec. 4.3)
    # block or stage names of the job's model, bottom-up: ("layer2",) is the paper's K = 2 on
    # ResNet-18, ("stem", "layer2", "layer3") its K = 4 (the authors' code's split points); None:
    # K = 2, cut after the middle block below the head (on ResNet-18 that is layer2, the paper's)
    splits: tuple[str, ...] | None = None
    adapter: AdapterKind = "conv1x1"
    frozen_bn: FrozenBN = "eval"
    # the head's input: the towers' top features summed (the code's) or averaged (module docstring)
    feature_fusion: FeatureFusion = "sum"
    ccvr: CCVRConfig = CCVRConfig()

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "its stages train towers outside the round's model and its last uploads feature statistics"

    @property
    def num_stages(self) -> int:
        return 2 if self.splits is None else len(self.splits) + 1

    @model_validator(mode="after")
    def _distinct(self) -> FuseFLConfig:
        if self.splits is not None and len(set(self.splits)) != len(self.splits):
            raise ValueError(
                f"splits {list(self.splits)} name a split point twice: list each once, bottom-up"
            )
        return self

    def check_models(self, models: list[nn.Module], spec: DataSpec) -> list[str]:
        """Checked on the driver with every model group's model (mixed architectures)."""
        where = list(self.splits) if self.splits else "default (each middle block)"
        fix = "split at stage boundaries every model has (e.g. [stem, layer2, layer3] for ResNet-10/18/26)"
        return [
            f"model_groups: the architectures cannot be fused at algorithm.splits {where}: {problem}; {fix}"
            for problem in tower_misfits(models, self.splits, self.adapter, spec)
        ]

    def check_model(self, model: nn.Module) -> list[str]:
        """Checked on the driver with the job's model, before any worker starts: the split points
        exist in it, bottom-up."""
        try:
            client_stages(model, split_points(model, self.splits))
        except ConfigError as err:
            return [f"algorithm.splits: {problem}" for problem in err.problems]
        return []


@dataclass(frozen=True)
class StagePayload:
    """What every client receives: the stage (K: CCVR's statistics), the fused blocks so far, and
    for CCVR the averaged head."""

    stage: int
    fused: Fused
    head: Params


@dataclass(frozen=True)
class StageUpload:
    """A client's upload: its adapter and block of the stage (``part``), its head at the last stage."""

    part: Params
    head: Params


@dataclass(frozen=True)
class OwnModel:
    """What a client keeps between stages: its whole model's state dict."""

    params: Params


@dataclass(frozen=True)
class FuseFLServer:
    """The fused model: its parts by stage and tower, the calibrated head, the towers' client ids."""

    fused: Fused
    head: Params
    towers: torch.Tensor  # int64 client ids, in tower order
    models: tuple[dict[str, Any], ...] = ()  # the towers' model sections where they differ


@register("algorithm", "fusefl")
class FuseFL:
    """FuseFL: K stages of training on the fused frozen lower blocks, then CCVR (NeurIPS 2024)."""

    Config = FuseFLConfig
    ClientState = OwnModel
    MIXED_MODELS = True  # clients may train different architectures (model_groups)

    def __init__(self, config: FuseFLConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[FuseFLServer]:
        """Every client is a tower, in id order (each of its own architecture when they differ)."""
        towers = range(info.num_clients)
        models = tuple(info.model_of(c) for c in towers) if info.mixes_models else ()
        ids = torch.as_tensor(list(towers), dtype=torch.int64)
        return init_state(params, info, FuseFLServer({}, {}, ids, models))

    def payload(self, state: ServerState[FuseFLServer], stage: int, info: RunInfo) -> Payload[StagePayload]:
        """Stage 0: the initial model (every client starts from it); later: the fused blocks."""
        extra = P.numpy_leaves(StagePayload(stage, state.extra.fused, state.extra.head))
        sends_model = stage == 0 and not state.extra.models  # mixed: each starts from its own
        return Payload(P.to_numpy(state.params) if sends_model else {}, extra=extra)

    def protocol(
        self, services: Services[Gathered[ClientResult[Any, OwnModel]]], state: ServerState[FuseFLServer]
    ) -> ServerState[FuseFLServer]:
        if services.start_round:
            raise ConfigError(
                [f"fusefl cannot resume at round {services.start_round}: run it again from the start"]
            )
        towers = state.extra.towers.numpy()  # every client, every stage
        heads: list[Params] = []
        for k in range(self.config.num_stages):
            # stage k: every client trains block k on the fused blocks below; the server fuses them
            payload = self.payload(state, k, services.info)
            out = services.train_cohort(payload, towers, k)
            uploads = self.complete(out.aggregate, towers, k)
            fused = {**state.extra.fused, str(k): {str(m): u.part for m, u in enumerate(uploads)}}
            heads = [u.head for u in uploads]
            state = replace(state, extra=replace(state.extra, fused=fused))
            services.log(services.round_metrics(out, payload), k)
        # the last stage's heads averaged, then calibrated on the fused model's features
        head = {name: torch.stack([h[name] for h in heads]).mean(dim=0) for name in heads[0]}
        state = replace(state, extra=replace(state.extra, head=head))
        head, metrics = self.calibrated(services, state, towers)
        state = replace(state, extra=replace(state.extra, head=head))
        services.log(metrics | self.evaluation(services, state), self.config.num_stages)
        return state

    def complete(
        self, aggregate: list[tuple[int, ClientResult[StageUpload, OwnModel]]], towers: np.ndarray, k: int
    ) -> list[StageUpload]:
        """The uploads in tower order; fusion needs every client's."""
        by_position = dict(aggregate)
        missing = [int(towers[i]) for i in range(len(towers)) if i not in by_position]
        if missing:
            raise RuntimeError(
                f"fusefl stage {k}: clients {missing} failed; the fused block needs every client's"
            )
        return [by_position[i].update for i in range(len(towers))]

    def calibrated(
        self,
        services: Services[Gathered[ClientResult[Any, OwnModel]]],
        state: ServerState[FuseFLServer],
        towers: np.ndarray,
    ) -> tuple[Params, Metrics]:
        """The averaged head calibrated by CCVR on the clients' fused features (or as it is)."""
        ccvr = self.config.ccvr
        if not ccvr.enabled:
            return state.extra.head, {}
        k = self.config.num_stages  # step K: the clients' class statistics of fused features
        out = services.train_cohort(self.payload(state, k, services.info), towers, k)
        stats = [result.update for _, result in out.aggregate]
        lr, info = ccvr.lr or self.config.local.lr, services.info
        head, loss = calibrated_head(state.extra.head, stats, info.spec.num_classes, ccvr, lr, info.seed)
        return head, {"ccvr/bytes_up": float(out.bytes_up), "ccvr/loss": loss}

    def fused_section(self, info: RunInfo, server: FuseFLServer) -> dict[str, Any]:
        """The registered ``fusefl_fused`` model section of this run's fused model."""
        mixed = {"towers": list(server.models)} if server.models else {}
        return {
            "name": "fusefl_fused",
            "base": info.model,
            "splits": self.config.splits,
            "num_towers": len(server.towers),
            "adapter": self.config.adapter,
            "feature_fusion": self.config.feature_fusion,
        } | mixed

    def evaluation(self, services: Services[object], state: ServerState[FuseFLServer]) -> Metrics:
        """The fused model's size, the paper's communication, and its evaluation (the job's plan)."""
        weights = fused_weights(state.extra)
        # parameters only, as Table 4: BatchNorm's running statistics and counters left out
        num_params = sum(
            int(w.numel()) for name, w in weights.items() if w.is_floating_point() and "running_" not in name
        )
        mib, towers = num_params * 4 / 2**20, len(state.extra.towers)
        metrics: Metrics = {"fusefl/params": float(num_params), "fusefl/mib": mib}
        metrics["fusefl/paper_comm_mib"] = towers * mib  # Table 13's M x |F_fus|
        section = self.fused_section(services.info, state.extra)
        return metrics | services.evaluate_weights([P.to_numpy(weights)], [section])

    # ---- worker ---------------------------------------------------------------------------------

    def client_update(self, ctx: ClientContext[StagePayload, OwnModel]) -> ClientResult[Any, OwnModel]:
        stage = ctx.payload.extra.stage
        model = copy.deepcopy(ctx.model)  # the resident model is never restructured
        if ctx.state is not None:
            model.load_state_dict(ctx.state.params)
        elif stage:
            raise RuntimeError(
                f"client {ctx.client_id} reached fusefl stage {stage} without its model of stage 0"
            )
        if stage == self.config.num_stages:
            return ClientResult(self.feature_stats(ctx, model), 1.0)
        net = self.staged_net(ctx, model, stage)
        metrics = train_context(replace(ctx, model=net, round_num=stage), self.config.local)  # lr by stage
        last = stage == self.config.num_stages - 1
        upload = StageUpload(
            part=P.clone(net.own.state_dict()), head=P.clone(net.head.state_dict()) if last else {}
        )
        weight = float(metrics.get("train/num_examples", len(ctx.data)))
        return ClientResult(upload, weight, metrics, state=OwnModel(P.clone(model.state_dict())))

    def staged_net(self, ctx: ClientContext[StagePayload, OwnModel], model: nn.Module, k: int) -> StagedNet:
        """Client m's stage-k model on ``model``'s own blocks (trained in place)."""
        stages = client_stages(model, split_points(model, self.config.splits))
        fused = ctx.payload.extra.fused
        lower, adapter = None, None
        if k:
            towers = tower_models(ctx.model_of, model, len(fused["0"]))
            lower = FusedStages(fused_parts(towers, self.config.splits, self.config.adapter, ctx.spec)[:k])
            lower.load_state_dict(part_weights(fused))  # the stages below k: all there are yet
            below = [shapes[k - 1] for shapes in tower_shapes(towers, self.config.splits, ctx.spec)]
            adapter = make_adapter(self.config.adapter, below, stage_output_shapes(stages, ctx.spec)[k - 1])
        own = FusedPart(adapter, stages[k])
        head = parts(model)["head"]  # type: ignore[arg-type]
        return StagedNet(lower, own, list(stages[k + 1 :]), head, self.config.frozen_bn).to(ctx.device)

    def feature_stats(self, ctx: ClientContext[StagePayload, OwnModel], model: nn.Module) -> FeatureStats:
        """CCVR's per-class statistics of the fused model's features on this client's data."""
        extra = ctx.payload.extra
        towers = tower_models(ctx.model_of, model, len(extra.fused["0"]))
        net = fused_net(towers, self.config.splits, self.config.adapter, ctx.spec, self.config.feature_fusion)
        net.load_state_dict(fused_weights(FuseFLServer(extra.fused, extra.head, torch.zeros(0))))
        net.to(ctx.device).eval()
        features, labels = [], []
        with torch.no_grad():
            for batch in iterate_batches(to_tensors(ctx.data, ctx.device), self.config.ccvr.batch_size):
                features.append(net.features(batch["x"]))
                labels.append(batch["y"])
        stats = class_statistics(torch.cat(features), torch.cat(labels), ctx.spec.num_classes)
        return FeatureStats(*(t.cpu() for t in (stats.count, stats.total, stats.outer)))


def part_weights(fused: Fused) -> Params:
    """The fused stages' state dict (``FusedStages``' names: ``stages.<k>.<m>.<name>``)."""
    return {
        f"stages.{k}.{m}.{n}": w
        for k, towers in fused.items()
        for m, part in towers.items()
        for n, w in part.items()
    }


def fused_weights(server: FuseFLServer) -> Params:
    """The fused model's state dict (``fusefl_fused``'s names) from the parts and the head."""
    return part_weights(server.fused) | {f"head.{name}": w for name, w in server.head.items()}
