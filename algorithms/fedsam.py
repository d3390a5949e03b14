"""FedSAM and FedASAM: FedAvg whose clients take sharpness-aware steps.

- FedSAM: local SAM (Foret et al., ICLR 2021, arXiv:2010.01412) in FL as in Qu et al., ICML 2022
  (arXiv:2206.02618) and Caldarola et al., ECCV 2022 (arXiv:2203.11834); rho 0.05, the FedGuCci
  authors' baseline setting (shared/papers/notes/fedgucci.md, section 5).
- FedASAM: local adaptive SAM (Kwon et al., ICML 2021, arXiv:2102.11600; Caldarola et al. 2022).
  Defaults rho 0.7, eta 0.2: the IMA authors' code for their CNNs (shared/papers/notes/ima.md,
  section 4); for ResNet, VGG and AlexNet that code uses rho 0.2, eta 0.05.
Both steps are ``raysim.sharpness.sam_step`` (two backward passes per batch).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.local import LocalTrainConfig, local_delta_update
from raysim.registry import register
from raysim.server_opt import ServerOptimizerConfig, apply_server_step
from raysim.sharpness import sam_step
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedSAMConfig(BaseModel, frozen=True, extra="forbid"):
    """FedSAM: FedAvg with SAM local steps (Qu et al. 2022; Caldarola et al. 2022)."""

    rho: float = Field(0.05, ge=0)
    adaptive: bool = False  # ASAM's scale-invariant neighbourhood
    eta: float = Field(0.01, ge=0)  # ASAM's T_w = |w| + eta; unused by SAM
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True


class FedASAMConfig(FedSAMConfig, frozen=True):
    """FedASAM: FedAvg with adaptive-SAM local steps (Caldarola et al. 2022)."""

    rho: float = Field(0.7, ge=0)  # CNNs; ResNet/VGG/AlexNet: rho 0.2, eta 0.05
    adaptive: bool = True
    eta: float = Field(0.2, ge=0)


@register("algorithm", "fedsam", config=FedSAMConfig)
@register("algorithm", "fedasam", config=FedASAMConfig)
class FedSAM:
    """FedSAM / FedASAM: FedAvg whose clients take (adaptive) sharpness-aware steps."""

    Config = FedSAMConfig

    def __init__(self, config: FedSAMConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState:
        return ServerState(params=P.clone(params), buffer_keys=info.buffer_keys)

    def broadcast(self, state: ServerState, round_num: int) -> Payload:
        return Payload(P.to_numpy(state.params))

    def client_update(self, ctx: ClientContext) -> ClientResult:
        config = self.config
        return local_delta_update(
            ctx, config.local, step=sam_step(config.rho, config.adaptive, eta=config.eta)
        )

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState, mean_delta: Params | None, round_num: int
    ) -> tuple[ServerState, Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
