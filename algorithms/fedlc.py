"""FedLC: FedAvg whose clients train on logit-calibrated cross-entropy.

Zhang et al., "Federated Learning with Label Distribution Skew via Logits Calibration", ICML 2022,
arXiv:2209.00189. Each client lowers logit c by ``strength * n_c^(-1/4)`` (the paper's tau)
before the cross-entropy, with n_c its own count of class c (``raysim.train.losses``); classes it
never saw drop out of its softmax. As the FedGuCci authors run it (Li et al., KDD 2025,
arXiv:2402.18949): ``logit_calibration: {strength: 0.1}`` (``raysim.train.losses.LogitCalibrationConfig``,
shared with FedGuCci+).
"""

from __future__ import annotations

from pydantic import BaseModel

from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.local import LocalHooks, LocalTrainConfig, examples_trained_on, train_client
from raysim.train.losses import LogitCalibrationConfig, fedlc_loss
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
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

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "its calibrated loss reads the client's label counts: one example's loss depends on the others"


@register("algorithm", "fedlc")
class FedLC:
    """FedLC: FedAvg whose clients calibrate their logits by their own label counts."""

    Config = FedLCConfig
    UPDATE_DELTA = ""  # compression encodes the update, a parameter delta

    def __init__(self, config: FedLCConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        require_classification(info, "algorithm fedlc", "it calibrates class logits by label counts")
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        calibrated = fedlc_loss(ctx, self.config.logit_calibration.strength)
        delta, metrics = train_client(ctx, self.config.local, LocalHooks(loss_fn=calibrated))
        return ClientResult(delta, examples_trained_on(metrics), metrics)

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
