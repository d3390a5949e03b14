"""MOON: model-contrastive federated learning (Li, He, Song, CVPR 2021, arXiv:2103.16257).

Each client adds to its cross-entropy ``mu * l_con`` with, per example,
``l_con = -log(exp(sim(z, z_glob) / T) / (exp(sim(z, z_glob) / T) + exp(sim(z, z_prev) / T)))``:
``z`` is the representation of the model being trained, ``z_glob`` that of the broadcast global
model (the positive) and ``z_prev`` that of the client's own previous local model (the negative,
kept in the client's state; the global model the first time), ``sim`` the cosine similarity.
The server is FedAvg's.

The representation is the model anatomy's ``features(x)`` (raysim/models/anatomy.py): the
FedGuCci code has no projection head (Li et al., KDD 2025, arXiv:2402.18949). The frozen models'
representations come from the resident model at their weights (``raysim.train.at_weights``,
through ``torch.func.functional_call``), in eval mode and without gradients, so no client holds a
second model copy.

Defaults: ``mu`` 1 and ``temperature`` 0.5 (the paper). The FedGuCci authors' code (Li et al., KDD
2025, arXiv:2402.18949) uses ``temperature: 1.0`` and a negative that is never updated: each client's
``prev_model`` is a copy of that client's own random initialisation (its ``Node`` builds a fresh
model), which ``negative: client_init`` reproduces: the job's model built afresh on the worker
under a seed of (run seed, client id) (``ClientContext.client_init``), the same every round, so
nothing is kept or sent. ``negative: shared_init`` is our own option, one fixed negative for
everyone: the run's shared initial model, broadcast beside the global model every round. This is a
choice of negative, not only paper against code, so it keeps its own key; ``client_init`` and
``shared_init`` name the same two starting models as ``local``'s ``start_from``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.at_weights import at_weights
from raysim.train.batching import Batch
from raysim.train.local import BatchLoss, LocalHooks, LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state
from raysim.types import (
    ClientContext,
    ClientResult,
    DataSpec,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
    feature_model,
    require_classification,
)


class MoonConfig(BaseModel, frozen=True, extra="forbid"):
    """MOON: cross-entropy plus a model-contrastive term on the representation (Li et al. 2021)."""

    mu: float = Field(1.0, ge=0)
    temperature: float = Field(0.5, gt=0)  # the FedGuCci code: 1.0
    # the contrastive negative: the client's previous local model (the paper), the client's own
    # random initialisation (the FedGuCci code's never-updated ``prev_model``), or the run's
    # shared initial model (our option)
    negative: Literal["previous", "client_init", "shared_init"] = "previous"
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return (
            "its contrastive term (an extra_loss over the batch's representations) is no loss of one example"
        )


def model_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float
) -> torch.Tensor:
    """MOON's ``l_con`` averaged over the batch: cross-entropy of the cosine logits
    ``[sim(z, z_glob), sim(z, z_prev)] / T`` with the global model's as the right class."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], -1)
    return -F.log_softmax(logits / temperature, dim=-1)[..., 0].mean()


@dataclass(frozen=True)
class InitialModel:
    """The run's initial model, kept by the server and sent to every client (``negative: initial``)."""

    initial: Params  # tensors on ``ctx.device`` in ``client_update`` (numpy arrays on the way)


@dataclass(frozen=True)
class PreviousModel:
    """What a client keeps between rounds (``negative: previous``): its last local model."""

    previous: Params


class FrozenFeatures:
    """Representations of other weights (the global model, a previous local model) computed by the
    resident model with those weights swapped in: no copy of the model, and its own weights,
    gradients and mode are as they were afterwards."""

    def __init__(self, model: nn.Module, params: Params) -> None:
        self.frozen = at_weights(model, params)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        model = self.frozen.model
        was_training = model.training
        model.eval()  # a frozen model is a fixed function: running BatchNorm statistics, no dropout
        try:
            return self.frozen.features(x)
        finally:
            model.train(was_training)


class MoonObjective:
    """Cross-entropy as the task loss, ``mu * l_con`` as the extra loss, from one forward pass.

    ``loss_fn`` computes the representation and the logits from it and keeps the representation;
    ``extra_loss``, which ``train_local`` calls next on the same batch, reuses it. So ``train/loss``
    stays the cross-entropy alone, comparable with FedAvg's.
    """

    def __init__(self, positive: FrozenFeatures, negative: FrozenFeatures, mu: float, temperature: float):
        self.positive, self.negative = positive, negative
        self.mu, self.temperature = mu, temperature
        self._kept: tuple[torch.Tensor, torch.Tensor] | None = None  # (batch x, its representation)

    def loss_fn(self, model: nn.Module, batch: Batch, spec: DataSpec) -> BatchLoss:
        x, y = batch["x"], batch["y"]
        net = feature_model(model, "moon")
        z = net.features(x)
        logits = net.head(z)
        self._kept = (x, z)
        return F.cross_entropy(logits, y), (logits.argmax(-1) == y).sum(), len(y)

    def extra_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x = batch["x"]
        kept, self._kept = self._kept, None
        z = kept[1] if kept is not None and kept[0] is x else feature_model(model, "moon").features(x)
        l_con = model_contrastive_loss(z, self.positive(x), self.negative(x), self.temperature)
        return self.mu * l_con


@register("algorithm", "moon")
class Moon:
    """MOON: FedAvg whose clients contrast their representation with the global and previous models'."""

    Config = MoonConfig
    ClientState = PreviousModel

    def __init__(self, config: MoonConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[InitialModel | None]:
        require_classification(info, "algorithm moon", "its loss is cross-entropy over class logits")
        initial = InitialModel(P.clone(params)) if self.config.negative == "shared_init" else None
        return init_state(params, info, initial)

    def payload(
        self, state: ServerState[InitialModel | None], round_num: int, info: RunInfo
    ) -> Payload[InitialModel | None]:
        return Payload(P.to_numpy(state.params), extra=P.numpy_leaves(state.extra))

    def client_update(
        self, ctx: ClientContext[InitialModel | None, PreviousModel]
    ) -> ClientResult[Params, PreviousModel]:
        feature_model(ctx.model, "moon")
        objective = MoonObjective(
            FrozenFeatures(ctx.model, ctx.global_params),
            FrozenFeatures(ctx.model, self._negative(ctx)),
            self.config.mu,
            self.config.temperature,
        )
        delta, metrics = train_client(
            ctx, self.config.local, LocalHooks(loss_fn=objective.loss_fn, extra_loss=objective.extra_loss)
        )
        # a fixed negative: nothing to keep
        kept = (
            PreviousModel(P.clone(P.model_params(ctx.model))) if self.config.negative == "previous" else None
        )
        return ClientResult(delta, examples_trained_on(metrics), metrics, state=kept)

    def _negative(self, ctx: ClientContext[InitialModel | None, PreviousModel]) -> Params:
        """The weights whose representation is pushed away: see ``MoonConfig.negative``."""
        if self.config.negative == "shared_init":
            if ctx.payload.extra is None:
                raise RuntimeError("moon negative: shared_init needs the initial model in the payload")
            return ctx.payload.extra.initial  # on ctx.device already
        if self.config.negative == "client_init":
            if ctx.client_init is None:
                raise RuntimeError("moon negative: client_init needs the worker's ClientContext.client_init")
            return ctx.client_init()
        return P.to_device(ctx.state.previous, ctx.device) if ctx.state else ctx.global_params

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self,
        state: ServerState[InitialModel | None],
        mean_delta: Params | None,
        round_num: int,
        info: RunInfo,
    ) -> tuple[ServerState[InitialModel | None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
