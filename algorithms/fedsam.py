"""FedSAM and FedASAM: FedAvg whose clients take sharpness-aware steps.

- FedSAM: local SAM (Foret et al., ICLR 2021, arXiv:2010.01412) in FL as in Qu et al., ICML 2022
  (arXiv:2206.02618) and Caldarola et al., ECCV 2022 (arXiv:2203.11834); rho 0.05, the FedGuCci
  authors' baseline setting (Li et al., KDD 2025, arXiv:2402.18949).
- FedASAM: local adaptive SAM (Kwon et al., ICML 2021, arXiv:2102.11600; Caldarola et al. 2022).
  Defaults rho 0.7, eta 0.2: the IMA authors' code for their CNNs (Zhou et al.,
  IEEE TMC 2024, arXiv:2305.07845); for ResNet, VGG and AlexNet that code uses rho 0.2, eta 0.05.
Both are FedAvg with ``raysim.train.sharpness.sam_step`` (two backward passes per batch), configured
by the ``sam`` option (``raysim.train.sharpness.SamConfig``) as in every plugin with SAM: FedSAM's
``sam: {rho: 0.05}``, FedASAM's ``sam: {rho: 0.7, adaptive: true, eta: 0.2}``. A partial ``sam``
keeps the rest of the plugin's default (``sam: {rho: 0.2, eta: 0.05}`` under fedasam stays ASAM).
"""

from __future__ import annotations

from pydantic import BaseModel

from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.local import LocalHooks, LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.train.sharpness import SamConfig, sam_step
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedSAMConfig(BaseModel, frozen=True, extra="forbid"):
    """FedSAM: FedAvg with SAM local steps (Qu et al. 2022; Caldarola et al. 2022)."""

    sam: SamConfig = SamConfig(rho=0.05)
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "SAM takes two gradients of every batch (ascent, then descent), and the accountant counts one"


class FedASAMConfig(FedSAMConfig, frozen=True):
    """FedASAM: FedAvg with adaptive-SAM local steps (Caldarola et al. 2022)."""

    sam: SamConfig = SamConfig(rho=0.7, adaptive=True, eta=0.2)  # CNNs; ResNet/VGG/AlexNet: rho 0.2, eta 0.05


@register("algorithm", "fedsam", config=FedSAMConfig)
@register("algorithm", "fedasam", config=FedASAMConfig)
class FedSAM:
    """FedSAM / FedASAM: FedAvg whose clients take (adaptive) sharpness-aware steps."""

    Config = FedSAMConfig
    UPDATE_DELTA = ""  # compression encodes the update, a parameter delta

    def __init__(self, config: FedSAMConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        delta, metrics = train_client(
            ctx, self.config.local, LocalHooks(step=sam_step(**self.config.sam.model_dump()))
        )
        return ClientResult(delta, examples_trained_on(metrics), metrics)

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
