"""FedLC: FedAvg whose clients train on logit-calibrated cross-entropy.

Zhang et al., "Federated Learning with Label Distribution Skew via Logits Calibration", ICML 2022,
arXiv:2209.00189. Each client lowers logit c by ``tau * n_c^(-1/4)`` before the cross-entropy,
with n_c its own count of class c (``raysim.losses``); classes it never saw drop out of its
softmax. As the FedGuCci authors run it (shared/papers/notes/fedgucci.md, section 5):
``logit_calibration: {tau: 0.1}`` (``raysim.losses.LogitCalibrationConfig``, shared with FedGuCci+).
"""

from __future__ import annotations

from pydantic import BaseModel

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.local import LocalTrainConfig, local_delta_update
from raysim.losses import LogitCalibrationConfig, fedlc_loss
from raysim.registry import register
from raysim.server_opt import ServerOptimizerConfig, apply_server_step
from raysim.types import (
    ClientContext,
    ClientResult,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
    require_classification,
)


class FedLCConfig(BaseModel, frozen=True, extra="forbid"):
    """FedLC: FedAvg with logit-calibrated local cross-entropy (Zhang et al. 2022)."""

    logit_calibration: LogitCalibrationConfig = LogitCalibrationConfig()
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True


@register("algorithm", "fedlc")
class FedLC:
    """FedLC: FedAvg whose clients calibrate their logits by their own label counts."""

    Config = FedLCConfig

    def __init__(self, config: FedLCConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState:
        require_classification(info, "algorithm fedlc", "it calibrates class logits by label counts")
        return ServerState(params=P.clone(params), buffer_keys=info.buffer_keys)

    def broadcast(self, state: ServerState, round_num: int) -> Payload:
        return Payload(P.to_numpy(state.params))

    def client_update(self, ctx: ClientContext) -> ClientResult:
        return local_delta_update(
            ctx, self.config.local, loss_fn=fedlc_loss(ctx, self.config.logit_calibration.tau)
        )

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState, mean_delta: Params | None, round_num: int
    ) -> tuple[ServerState, Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
