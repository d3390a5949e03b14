"""FedAvg with norm-bounded client updates and a decaying server lr (the worked example of
docs/writing-a-plugin.md).

Each client sends ``delta * min(1, clip_norm / ||delta||)``, the global L2 norm taken over its
trainable parameters (float buffers such as BatchNorm statistics travel unclipped): the norm
bounding that limits what any one client can do to the model (Sun et al. 2019, "Can You Really
Backdoor Federated Learning?", arXiv:1911.07963), and the clipping step of DP-FedAvg without its
noise (McMahan et al., ICLR 2018, arXiv:1710.06963). The server steps with
``server.lr * server_lr_decay ** round_num``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedAvgClipConfig(BaseModel, frozen=True, extra="forbid"):
    """FedAvg with norm-clipped client deltas and server lr decay (the how-to's example)."""

    clip_norm: float = Field(1.0, gt=0)
    server_lr_decay: float = Field(1.0, gt=0, le=1)  # 1.0: a constant server lr
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True


def clip(delta: Params, max_norm: float, skip: set[str]) -> tuple[Params, float]:
    """``delta`` scaled to a global L2 norm of at most ``max_norm`` over the keys not in ``skip``;
    also returns the norm before clipping."""
    norm = P.global_norm(delta, skip)
    scale = min(1.0, max_norm / norm) if norm > 0 else 1.0
    return {k: v if k in skip else v * scale for k, v in delta.items()}, norm


@register("algorithm", "fedavg_clip")
class FedAvgClip:
    """FedAvg whose clients clip their delta; the server lr decays per round."""

    Config = FedAvgClipConfig
    UPDATE_DELTA = ""  # compression encodes the update, a parameter delta

    def __init__(self, config: FedAvgClipConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)  # the params, and no state beyond them

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        delta, metrics = train_client(ctx, self.config.local)
        buffers = {name for name, _ in ctx.model.named_buffers()}  # init() ran on the driver only
        update, norm = clip(delta, self.config.clip_norm, buffers)  # a mean delta
        clipping = {"clip/norm": norm, "clip/clipped": float(norm > self.config.clip_norm)}
        return ClientResult(update, examples_trained_on(metrics), metrics | clipping)

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        lr = self.config.server.lr * self.config.server_lr_decay**round_num
        server = self.config.server.model_copy(update={"lr": lr})
        state, metrics = apply_server_step(state, mean_delta, server)
        return state, metrics | {"server/lr": lr}
