"""FedRoD: a generic model trained for balanced risk plus a personal head per client (Chen & Chao,
"On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR 2022,
arXiv:2107.00778).

Each sampled client, on every batch of its local training (Li et al., KDD 2025, arXiv:2402.18949):
1. takes the generic model's step on the balanced-softmax loss ``CE(softmax(g(f(x)) + log n), y)``
   (``raysim.train.losses.balanced_softmax_loss``), ``n_c`` the count of class ``c`` among the client's
   examples this round. A class it lacks gets ``log 0 = -inf`` (probability 0, no gradient): the
   literal balanced softmax, as PFLlib. FedGuCci's code counts an absent class as 1 instead
   (``torch.where(n > 0, n, 1)``: ``log 1 = 0``, so the class keeps its raw logit and a gradient
   pushing it down); ``absent_class_count: 1`` reproduces that;
2. takes one plain SGD step, at the round's local lr, of its personal head ``p`` on
   ``CE(g(f(x)) + p(f(x)), y)``, the features ``f(x)`` and generic logits ``g(f(x))`` taken from
   step 1's forward pass and detached: the personal head learns what the generic one misses.
``p`` has ``model.head``'s architecture; it starts as a copy of the current global head the
first time the client is sampled and lives in the client's state. FedGuCci's and PFLlib's code
instead give every client its head at the start of the run (the initial head), which differs
under partial participation: a client first sampled in a later round starts here from that
round's trained global head. The server averages the generic model's deltas (FedAvg,
``raysim.train.server_opt``), and the global evaluation uses the generic model alone. The personalised
predictor ``g + p`` is measured on the client's own training data of the round, after its
training (the client metric ``fedrod/personal_train_accuracy``), and, at every evaluation, on each
evaluated client's test split (``personal_model``: ``eval/personal/...``, the paper's
personalized accuracy); a client never sampled predicts with ``g + g``, the head it would start from.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import nn

from raysim import params as P
from raysim.aggregate import WeightedMean
from raysim.registry import register
from raysim.train.batching import Batch, iterate_batches, to_tensors
from raysim.train.local import (
    Backward,
    BatchLoss,
    LocalHooks,
    LocalTrainConfig,
    examples_trained_on,
    round_lr,
    train_client,
)
from raysim.train.losses import balanced_softmax_loss, client_label_counts
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.types import (
    ClientContext,
    ClientData,
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


class FedRoDConfig(BaseModel, frozen=True, extra="forbid"):
    """FedRoD: balanced-softmax generic model, averaged; a personal head kept by each client."""

    absent_class_count: Literal[0, 1] = 0  # n_c of a class the client lacks; 1: FedGuCci's code
    local: LocalTrainConfig = LocalTrainConfig()
    server: ServerOptimizerConfig = ServerOptimizerConfig()
    weighted: bool = True

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "its balanced loss reads the label counts; its personal head trains on plain gradients"


def class_counts(data: ClientData, num_classes: int, absent: int = 0) -> torch.Tensor:
    """``n_c``: how many of the client's examples have label ``c``, (num_classes,) float; a class
    without examples counts ``absent`` (0: the balanced softmax; 1: FedGuCci's code)."""
    counts = client_label_counts(data, num_classes)
    return counts.masked_fill(counts == 0, absent)


@dataclass(frozen=True)
class PersonalHead:
    """What a client keeps between rounds (``ClientResult.state``, then ``ctx.state``)."""

    head: Params  # the personal head's state dict


class PersonalHeadStep:
    """A ``LocalStep`` and its ``loss_fn``: the generic step on the balanced softmax, then the
    personal head's step on the same forward pass (detached)."""

    def __init__(self, head: nn.Module, counts: torch.Tensor, lr: float) -> None:
        self.head = head
        self.counts = counts
        self.optimizer = torch.optim.SGD(head.parameters(), lr=lr)
        self._forward: tuple[torch.Tensor, torch.Tensor] | None = None  # this batch's f(x), g(f(x))

    def generic_loss(self, model: nn.Module, batch: Batch, spec: DataSpec) -> BatchLoss:
        """The balanced-softmax loss; accuracy counts the generic model's own predictions."""
        net = feature_model(model, "fedrod")
        features = net.features(batch["x"])  # (B, D)
        logits = net.head(features)  # (B, C)
        self._forward = (features.detach(), logits.detach())
        y = batch["y"]
        return balanced_softmax_loss(logits, y, self.counts), (logits.argmax(-1) == y).sum(), len(y)

    def __call__(
        self, model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, backward: Backward
    ) -> BatchLoss:
        loss = backward(batch)  # runs generic_loss, which keeps the forward pass
        optimizer.step()
        if self._forward is None:
            raise RuntimeError(
                "PersonalHeadStep: train with loss_fn=generic_loss, which keeps the forward pass"
            )
        features, generic_logits = self._forward
        personal_loss = F.cross_entropy(generic_logits + self.head(features), batch["y"])
        self.optimizer.zero_grad(set_to_none=True)
        personal_loss.backward()
        self.optimizer.step()
        return loss


class PersonalizedPredictor(nn.Module):
    """The personalised predictor ``g(f(x)) + p(f(x))``: the generic model plus a personal head."""

    def __init__(self, model: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        net = feature_model(self.model, "fedrod")
        features = net.features(x)  # (B, D)
        logits: torch.Tensor = net.head(features) + self.head(features)  # (B, C)
        return logits


def personal_head(model: nn.Module, state: PersonalHead | None) -> nn.Module:
    """The client's personal head: its state's, else a copy of the current global head."""
    head = copy.deepcopy(feature_model(model, "fedrod").head)
    if state:
        head.load_state_dict(state.head)
    return head


@torch.no_grad()
def personal_train_accuracy(
    model: nn.Module, head: nn.Module, data: ClientData, device: torch.device
) -> float:
    """Accuracy of the personalised predictor ``g(f(x)) + p(f(x))`` on ``data``, the client's
    training data (0 when empty)."""
    predictor = PersonalizedPredictor(model, head).eval()  # the worker sets train mode again
    correct: torch.Tensor | int = 0
    for batch in iterate_batches(to_tensors(data, device), 512):
        correct = correct + (predictor(batch["x"]).argmax(-1) == batch["y"]).sum()
    return float(correct) / max(len(data), 1)


@register("algorithm", "fedrod")
class FedRoD:
    """FedRoD: FedAvg on a balanced-softmax generic model; clients keep personal heads."""

    Config = FedRoDConfig
    ClientState = PersonalHead

    def __init__(self, config: FedRoDConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        require_classification(
            info, "algorithm fedrod", "its balanced softmax and personal heads work on classes"
        )
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def client_update(self, ctx: ClientContext[None, PersonalHead]) -> ClientResult[Params, PersonalHead]:
        head = personal_head(ctx.model, ctx.state)
        counts = class_counts(ctx.data, ctx.spec.num_classes, self.config.absent_class_count)
        counts = counts.to(ctx.device)
        step = PersonalHeadStep(head, counts, round_lr(self.config.local, ctx.round_num))
        delta, metrics = train_client(
            ctx, self.config.local, LocalHooks(loss_fn=step.generic_loss, step=step)
        )
        accuracy = personal_train_accuracy(ctx.model, head, ctx.data, ctx.device)
        return ClientResult(
            delta,
            examples_trained_on(metrics),
            {**metrics, "fedrod/personal_train_accuracy": accuracy},
            state=PersonalHead(P.clone(head.state_dict())),
        )

    def personal_model(self, ctx: ClientContext[None, PersonalHead]) -> nn.Module:
        """The client's personalised predictor ``g + p``, evaluated on its test split."""
        return PersonalizedPredictor(ctx.model, personal_head(ctx.model, ctx.state))

    def aggregator(self) -> WeightedMean[Params]:
        return WeightedMean(weighted=self.config.weighted)

    def server_update(
        self, state: ServerState[None], mean_delta: Params | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        return apply_server_step(state, mean_delta, self.config.server)
