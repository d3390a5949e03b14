"""FedGMA: gradient masked averaging (Tenison, Sreeharsha, Rish et al., "Gradient Masked Averaging
for Federated Learning", TMLR 2023, arXiv:2201.11986).

The server scales each coordinate of the mean client update by how much the cohort agrees on its
direction. With ``m`` clients that trained and deltas ``delta_i = global - local_i``:

    A    = |sum_i sign(delta_i)| / m                   (per coordinate, in [0, 1])
    mask = 1 where A >= threshold, else A              (the paper's soft mask)
    w   <- w - server_lr * mask * mean(delta)          (mean weighted by examples, as FedAvg)

``agreement_threshold`` (the paper's tau) is 0.8 (the IMA paper's setting; Zhou et al., IEEE TMC
2024, arXiv:2305.07845). The server step is ``raysim.train.server_opt`` on the masked mean delta (plain SGD at
lr 1 by default). Float buffers (BatchNorm statistics) have no direction to agree on: they take
the plain mean.

``reading: ima_code`` is the version the IMA authors ran as their FedGMA baseline
(github TailinZhou/FedIMA, ``utils/aggregator.py``; Zhou et al., IEEE TMC 2024, arXiv:2305.07845): the FedAvg
aggregate
``w_fma = w - mean(delta)`` plus a hard AND-masked step at server lr 1e-4, where client ``i``
counts at a coordinate when its sign agrees with the cohort's and ``|sum_i sign(delta_i)| > threshold m``
(strictly):

    w <- w_fma - ima_code_server_lr * (1/m) sum_i and_mask_i * (local_i - global)

That is the code's sign: it descends on ``local - global``, so the masked term moves the model
back towards the old global by 1e-4 of the agreeing clients' mean update, and the result is
within float noise of FedAvg (as the IMA paper's FedGMA numbers are).

This rule is our reading of the code, not a literal run of it. The code's loop sets
``p1.data = p0.data`` (global model's parameter := the ``w_fma`` model's), which aliases the two
tensors: every client's in-place ``p1.data -= ...`` accumulates into ``w_fma``, and from the second
client on ``p1`` is the running result, so that client's term and mask use ``local_i - w_running``
instead of ``local_i - global``, and the result depends on the clients' order. raysim uses
``local_i - global`` (the old global) for every client: order-independent, so the cohort's terms
are a sum the aggregator can accumulate. At the default lr 1e-4 both stay within float noise of
FedAvg; at a large lr they differ visibly.

Traffic: ``sys/bytes_up`` counts every tensor a client's ``GMAUpdate`` holds, so it includes the
sign tensors (one per trainable parameter: about twice FedAvg's bytes) and, for ``ima_code``, the
positive and negative parts (about four times). They are there only so that a ``Sum`` can
aggregate the round; a real server receives each client's delta and takes its signs itself, so
the protocol sends one delta per client, as FedAvg. Compare traffic with that in mind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, Field, model_validator

from raysim.aggregate import Sum
from raysim.registry import register
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.types import ClientContext, ClientResult, Metrics, Params, Payload, RunInfo, ServerState


class FedGMAConfig(BaseModel, frozen=True, extra="forbid"):
    """FedGMA: the mean client delta, scaled per coordinate by the cohort's sign agreement."""

    agreement_threshold: float = Field(0.8, gt=0, le=1)  # A at or above which a coordinate passes whole
    # paper: the soft mask above; ima_code: the IMA authors' FedGMA baseline (module docstring)
    reading: Literal["paper", "ima_code"] = "paper"
    ima_code_server_lr: float = Field(1e-4, gt=0)  # the IMA code's lr on its masked term
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True  # mean delta weighted by examples (the sign agreement never is)

    @model_validator(mode="after")
    def _ima_code_has_no_server_optimizer(self) -> "FedGMAConfig":
        if self.reading == "ima_code" and self.server != ServerOptimizerConfig():
            raise ValueError(
                "reading ima_code is the IMA authors' FedAvg aggregate plus their masked term, "
                "with no server optimizer: leave server at its default (sgd, lr 1)"
            )
        return self


@dataclass(frozen=True)
class GMAUpdate:
    """What a client sends, summed over the cohort by ``Sum`` (so the sum is one too)."""

    delta: Params  # w * (global - local)
    weight: torch.Tensor  # w: the examples trained on (1 when not ``weighted``; 0 without data)
    sign: Params  # sign(delta), trainable parameters only
    count: torch.Tensor  # 1 for a client that trained, 0 without data
    positive: Params  # delta where > 0, unweighted: the ima_code reading only (else empty)
    negative: Params  # delta where < 0, unweighted: the ima_code reading only (else empty)


def agreement_mask(sign_sum: torch.Tensor, count: torch.Tensor, threshold: float) -> torch.Tensor:
    """The paper's soft mask: 1 where ``A = |sign_sum| / count >= threshold``, else ``A``."""
    agreement = sign_sum.abs() / count.clamp_min(1)  # no client trained: A = 0, and so is the mean
    return torch.where(agreement >= threshold, torch.ones_like(agreement), agreement)


def agreeing_sum(sums: GMAUpdate, key: str, threshold: float) -> torch.Tensor:
    """The IMA code's AND-masked sum: the deltas of the clients on the majority's side, where
    ``|sign_sum| > threshold * count``."""
    sign_sum = sums.sign[key]
    side = torch.where(sign_sum > 0, sums.positive[key], sums.negative[key])
    return side * (sign_sum.abs() > threshold * sums.count)


@register("algorithm", "fedgma")
class FedGMA:
    """FedGMA: FedAvg clients; the server masks the mean delta by sign agreement."""

    Config = FedGMAConfig

    def __init__(self, config: FedGMAConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[GMAUpdate, None]:
        delta, metrics = train_client(ctx, self.config.local)
        num_examples = examples_trained_on(metrics)
        trained = num_examples > 0
        w = (num_examples if self.config.weighted else 1.0) if trained else 0.0
        trainable = {name for name, p in ctx.model.named_parameters() if p.requires_grad}
        with_parts = self.config.reading == "ima_code"
        update = GMAUpdate(
            delta={k: v * w for k, v in delta.items()},
            weight=torch.tensor(float(w)),
            sign={k: torch.sign(v) for k, v in delta.items() if k in trainable},
            count=torch.tensor(float(trained)),
            positive={k: v.clamp_min(0) for k, v in delta.items() if k in trainable} if with_parts else {},
            negative={k: v.clamp_max(0) for k, v in delta.items() if k in trainable} if with_parts else {},
        )
        return ClientResult(update, num_examples, metrics)

    def aggregator(self) -> Sum[GMAUpdate]:
        return Sum()

    def pseudo_gradient(self, sums: GMAUpdate) -> Params:
        """The masked mean delta (buffers unmasked); for ima_code, ``w - w_new`` of its rule."""
        threshold = self.config.agreement_threshold
        mean = {k: v / sums.weight.clamp_min(1e-12) for k, v in sums.delta.items()}  # 0/0 -> 0
        if self.config.reading == "ima_code":
            step = self.config.ima_code_server_lr / sums.count.clamp_min(1)
            return {
                k: v - step * agreeing_sum(sums, k, threshold) if k in sums.sign else v
                for k, v in mean.items()
            }
        return {
            k: agreement_mask(sums.sign[k], sums.count, threshold) * v if k in sums.sign else v
            for k, v in mean.items()
        }

    def server_update(
        self, state: ServerState[None], sums: GMAUpdate | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        if sums is None or float(sums.count) == 0:  # nobody trained: keep the model
            return state, {}
        state, metrics = apply_server_step(state, self.pseudo_gradient(sums), self.config.server)
        agreed = [self._agreed(sums.sign[k], sums.count) for k in sums.sign]
        fraction = sum(float(a.sum()) for a in agreed) / max(sum(a.numel() for a in agreed), 1)
        return state, {**metrics, "fedgma/agreed_fraction": fraction}

    def _agreed(self, sign_sum: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Where the cohort agrees enough to pass a coordinate whole (the reading's threshold)."""
        if self.config.reading == "ima_code":
            return sign_sum.abs() > self.config.agreement_threshold * count
        return sign_sum.abs() / count.clamp_min(1) >= self.config.agreement_threshold
