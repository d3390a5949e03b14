"""FedFomo: each client combines the models of the peers that help it most, weighted by first-order
model optimization (Zhang et al., "Personalized Federated Learning with First Order Model
Optimization", ICLR 2021, arXiv:2012.08565).

There is no global model. The server keeps every client's latest model and an affinity of each
client for each peer (the sum of the weights the client gave that peer so far). Each round:
1. server (``client_payload``): each sampled client receives up to ``num_peers`` models of other
   clients, chosen epsilon-greedily slot by slot as the authors' code does (NVlabs/FedFomo,
   ``get_federating_clients``, with its ``EPSILON`` 0.3 and ``EPSILON_DECAY`` 0.05 a round): each
   slot takes the next peer of a random order with probability epsilon (``epsilon`` less
   ``epsilon_decay`` per round, not below 0), else the next of highest affinity, skipping peers
   already taken; all at random while the client has no affinity yet. A client that never
   trained also receives the initial model;
2. client: starting from its own model ``θ_i`` (its state; the initial model the first time) it
   weighs each peer ``n`` by ``w_n = max(0, (L(θ_i) - L(θ_n)) / ||θ_n - θ_i||)``, ``L`` its mean
   loss on its scoring split (``scoring_fraction`` of its examples, PFLlib's 20%, which the LSS
   baselines here follow, ``split_for_scoring``), moves to ``θ_i + Σ_n w_n (θ_n - θ_i) / Σ_n w_n`` where some
   ``w_n > 0`` (else keeps ``θ_i``), trains on the rest of its examples and uploads its model and
   its weights;
3. server: stores the model and adds the weights to the client's affinities.

The shared payload is empty: everything a client receives is its own (``sys/bytes_down/per_client``:
``num_peers`` models a client, the paper's download cost). The server state holds every client's
model, so it grows with the population. A client's predictor is its own model (``personal_model``,
``eval/personal/...``); the global evaluation sees the initial model, which FedFomo never changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, TypeAlias

import numpy as np
import torch
from pydantic import BaseModel, Field
from torch import nn

from raysim import params as P
from raysim.aggregate import Gather, Gathered
from raysim.measure.evaluate import evaluate
from raysim.plugin_defaults import init_state
from raysim.registry import register
from raysim.sampling import client_seed, split_validation
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_context
from raysim.types import (
    ClientContext,
    ClientData,
    ClientResult,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
)


class FedFomoConfig(BaseModel, frozen=True, extra="forbid"):
    """FedFomo: clients combine their peers' models, weighted by the loss they lower on a scoring split."""

    num_peers: int = Field(5, ge=1)  # M: models a client downloads per round
    epsilon: float = Field(0.3, ge=0, le=1)  # chance of random peers instead of the top-affinity ones
    epsilon_decay: float = Field(0.05, ge=0)  # subtracted from epsilon per round
    scoring_fraction: float = Field(0.2, gt=0, lt=1)  # of each client's examples, never trained on
    local: LocalTrainConfig = LocalTrainConfig()

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        return "it scores its peers on held-back examples and uploads the scores without noise"


@dataclass(frozen=True)
class Affinities:
    """The server's memory: every client's latest model and its affinity for each peer (ids as
    strings, as checkpoints keep them)."""

    # older checkpoints also hold the run seed as seed: resuming ignores it (``stored.rebuild``)
    RETIRED_FIELDS: ClassVar[frozenset[str]] = frozenset({"seed"})

    models: dict[str, Params]
    affinity: dict[str, dict[str, float]]


@dataclass(frozen=True)
class Peers:
    """What one client receives: its peers' ids and models, the initial model the first time, and
    the run seed, which draws its scoring split (``split_for_scoring``)."""

    ids: list[int]
    models: list[Params]  # tensors on ``ctx.device`` in ``client_update`` (numpy arrays on the way)
    start: Params | None
    seed: int


@dataclass(frozen=True)
class Upload:
    """What one client sends: its model after training and the weight it gave each peer."""

    client_id: int
    model: Params
    peers: list[int]
    weights: torch.Tensor  # (num peers,)


@dataclass(frozen=True)
class OwnModel:
    """What a client keeps between rounds: its own model."""

    model: Params


Result: TypeAlias = ClientResult[Upload, OwnModel]  # what a client sends, and ``Gather`` keeps


def split_for_scoring(
    data: ClientData, fraction: float, seed: int, client_id: int
) -> tuple[ClientData, ClientData]:
    """(train, scoring): ``ceil(fraction * n)`` of the ``n`` examples (at least one, and one left
    to train on, when there are two or more) are the scoring split, a seeded choice per client
    (``raysim.sampling.split_validation`` of the run ``seed``), each part in stored order.

    Not the last rows: a store that keeps a client's rows grouped (by label, by source) would
    score on one group. The same rows every round (for the same data): the scoring split is never
    trained on, so the client's own model, trained on the rest in earlier rounds, is scored on
    examples it has not seen, as its peers' are; a split drawn per round would score it on
    examples it trained on last round and favour it over every peer."""
    n = len(data)
    num_val = min(max(math.ceil(fraction * n), 1), n - 1) if n >= 2 else 0
    train, scoring = split_validation(n, num_val, seed, client_id)
    return (
        ClientData({k: v[train] for k, v in data.arrays.items()}, data.batch_transform),
        ClientData({k: v[scoring] for k, v in data.arrays.items()}),
    )


def peer_weights(
    model: nn.Module,
    own: Params,
    peers: list[Params],
    scoring: ClientData,
    ctx: ClientContext[None, OwnModel, Peers],
) -> torch.Tensor:
    """``w_n = max(0, (L(own) - L(peer_n)) / ||peer_n - own||)`` on ``scoring``, (num peers,);
    zeros without scoring examples. Leaves ``model`` holding ``own``."""
    if not len(scoring) or not peers:
        return torch.zeros(len(peers))

    def loss(weights: Params) -> float:
        P.load_into(model, weights)
        return evaluate(model, scoring, ctx.spec, ctx.device)["loss"]

    own_loss = loss(own)
    weights = []
    for peer in peers:
        distance = P.distance(peer, own)
        weights.append(max(0.0, (own_loss - loss(peer)) / distance) if distance > 0 else 0.0)
    P.load_into(model, own)
    return torch.tensor(weights, dtype=torch.float64)


@register("algorithm", "fedfomo")
class FedFomo:
    """FedFomo: each client moves towards the peers whose models lower the loss on its scoring split."""

    Config = FedFomoConfig
    ClientState = OwnModel

    def __init__(self, config: FedFomoConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[Affinities]:
        return init_state(params, info, Affinities({}, {}))

    def payload(self, state: ServerState[Affinities], round_num: int, info: RunInfo) -> Payload[None]:
        return Payload({})  # nothing shared: every client's payload is its own

    def client_payload(
        self, state: ServerState[Affinities], round_num: int, client_id: int, info: RunInfo
    ) -> Peers:
        memory = state.extra
        ids = self.choose_peers(memory, info.seed, round_num, client_id)
        start = None if str(client_id) in memory.models else state.params
        return P.numpy_leaves(Peers(ids, [memory.models[str(j)] for j in ids], start, info.seed))

    def choose_peers(self, memory: Affinities, seed: int, round_num: int, client_id: int) -> list[int]:
        """Up to ``num_peers`` other clients with a model, slot by slot: with probability epsilon
        the next of a seeded random order, else the next of highest affinity (ties: lower id)."""
        candidates = sorted(int(k) for k in memory.models if int(k) != client_id)
        m = min(self.config.num_peers, len(candidates))
        rng = np.random.default_rng(client_seed(seed, round_num, client_id))  # the run's seed
        shuffled = [int(j) for j in rng.permutation(candidates)]
        affinity = memory.affinity.get(str(client_id), {})
        if not affinity:
            return sorted(shuffled[:m])
        epsilon = max(self.config.epsilon - self.config.epsilon_decay * round_num, 0.0)
        ranked = sorted(candidates, key=lambda j: (-affinity.get(str(j), 0.0), j))
        chosen: list[int] = []
        for explore in rng.random(m) < epsilon:
            source = shuffled if explore else ranked
            chosen.append(next(j for j in source if j not in chosen))
        return chosen

    def client_update(self, ctx: ClientContext[None, OwnModel, Peers]) -> ClientResult[Upload, OwnModel]:
        peers = ctx.client_payload
        if peers is None:
            raise ValueError(f"fedfomo: client {ctx.client_id} received no peers (client_payload)")
        own = ctx.state.model if ctx.state is not None else peers.start
        if own is None:
            raise ValueError(f"fedfomo: client {ctx.client_id} has neither a model of its own nor a start")
        models = peers.models
        P.load_into(ctx.model, own)  # the worker loaded nothing: the payload shares no params
        train, scoring = split_for_scoring(ctx.data, self.config.scoring_fraction, peers.seed, ctx.client_id)
        weights = peer_weights(ctx.model, own, models, scoring, ctx)
        if weights.sum() > 0:  # θ_i + Σ w_n (θ_n - θ_i) / Σ w_n
            share = (weights / weights.sum()).tolist()
            moved = {k: w + sum(s * (m[k] - w) for s, m in zip(share, models)) for k, w in own.items()}
            P.load_into(ctx.model, moved)
        ctx.model.train()
        metrics = train_context(replace(ctx, data=train), self.config.local)
        model = P.clone(P.model_params(ctx.model))
        upload = Upload(ctx.client_id, model, peers.ids, weights)
        metrics["fedfomo/positive_peers"] = float((weights > 0).sum())
        return ClientResult(upload, examples_trained_on(metrics), metrics, OwnModel(model))

    def personal_model(self, ctx: ClientContext[None, OwnModel]) -> nn.Module:
        """The client's own model (the initial model when it never trained)."""
        if ctx.state is not None:
            P.load_into(ctx.model, ctx.state.model)
        return ctx.model

    def aggregator(self) -> Gather[Result]:
        return Gather()

    def server_update(
        self, state: ServerState[Affinities], gathered: Gathered[Result], round_num: int, info: RunInfo
    ) -> tuple[ServerState[Affinities], Metrics]:
        models = dict(state.extra.models)
        affinity = {k: dict(row) for k, row in state.extra.affinity.items()}
        for _, result in gathered:
            upload = result.update
            models[str(upload.client_id)] = P.clone(upload.model)
            row = affinity.setdefault(str(upload.client_id), {})
            for peer, weight in zip(upload.peers, upload.weights.tolist()):
                row[str(peer)] = row.get(str(peer), 0.0) + weight
        extra = replace(state.extra, models=models, affinity=affinity)
        return replace(state, extra=extra), {"fedfomo/num_models": float(len(models))}
