"""Local: every client trains its own model alone and nothing is aggregated (the "Local" baseline
of FedGuCci, Li et al., KDD 2025, arXiv:2402.18949).

Each client starts from an initial model the first time it is sampled and from its own model,
kept in its client state, every time after; the global model never changes. The initial model is
by default the run's shared one (``start_from: shared_init``), broadcast only in rounds whose
cohort holds a client without a model of its own (``trained`` in the server state lists those that
have one); otherwise the broadcast is empty. In the FedGuCci code each client's model starts from
its own independent random initialisation (each ``Node`` builds a fresh model): ``start_from:
client_init`` does that, the job's model built afresh on the worker under a seed of (run seed,
client id) (``ClientContext.client_init``), and never broadcasts anything.

What the papers report is the mean over clients of their local models' accuracy on the global test
set. When evaluation is due (``evaluation.every`` and the last round) this plugin evaluates local
models and logs
- ``eval/local/accuracy``, ``eval/local/loss``: the mean over those models on the central test set
  (when the dataset has one), and ``eval/local/num_clients``, how many;
- ``eval/local/clients/accuracy``, ``eval/local/clients/loss``: each model on its own client's test
  split, summarized as ``eval/clients/*`` are (``raysim.measure.pooling.summarize_clients``): the
  clients' examples pooled, the mean over clients (``_mean``) and the spread (``_std``, ``_p10`` ...);
and so for the dataset's scores (``eval/local/mcc``, ``eval/local/clients/mcc``: MCC, F1, Pearson)
and without accuracy for a regression task.
In an intermediate evaluation round those models are the round's cohort's (only they travel to
the driver then); after the last round, every client that has a model: the cohort's, then the
others' read back from their client state, a cohort's worth at a time (a pass through
``train_cohort`` in which each client loads its kept model and trains nothing).
The usual ``eval/...`` metrics describe the unchanging global (initial) model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel

from raysim import params as P
from raysim.aggregate import Sum
from raysim.errors import NonFiniteError
from raysim.measure import scores
from raysim.measure.pooling import summarize_clients
from raysim.registry import register
from raysim.services import EVALUATE, MapRequest, RoundOptions, Services
from raysim.train.dp_sgd import sample_counts
from raysim.train.local import LocalTrainConfig, examples_trained_on, train_client
from raysim.train.server_opt import init_state
from raysim.types import (
    ClientContext,
    ClientResult,
    Metrics,
    NumpyParams,
    Params,
    Payload,
    RunInfo,
    ServerState,
)

# a local model's evaluation rows: on the central test set, on its own client's test split
EvalRows = tuple[Metrics | None, Metrics | None]


class LocalOnlyConfig(BaseModel, frozen=True, extra="forbid"):
    """Local: each client trains its own model across rounds; no aggregation."""

    local: LocalTrainConfig = LocalTrainConfig()
    # where a client's model starts: the run's shared initial model, or the client's own random
    # initialisation (the FedGuCci code's); the same two models as moon's ``negative`` names
    start_from: Literal["shared_init", "client_init"] = "shared_init"


@dataclass(frozen=True)
class TrainedClients:
    """The server's state beyond the params (``ServerState.extra``)."""

    trained: torch.Tensor  # ids of the clients with a model of their own (int64)


@dataclass(frozen=True)
class OwnModel:
    """What a client keeps between rounds (``ClientResult.state``, then ``ctx.state``)."""

    params: Params


@dataclass(frozen=True)
class Recall:
    """``Payload.extra`` asking clients to load their kept model and train nothing."""


@register("algorithm", "local")
class LocalOnly:
    """Local: clients train alone, each keeping its model between rounds; the global model stays."""

    Config = LocalOnlyConfig
    ClientState = OwnModel

    def __init__(self, config: LocalOnlyConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[TrainedClients]:
        return init_state(params, info, TrainedClients(torch.zeros(0, dtype=torch.int64)))

    def payload(
        self, state: ServerState[TrainedClients], round_num: int, info: RunInfo
    ) -> Payload[Recall | None]:
        """The shared initial model, from which a client without a model of its own starts."""
        return Payload(P.to_numpy(state.params))

    def client_update(self, ctx: ClientContext[Recall | None, OwnModel]) -> ClientResult[Params, OwnModel]:
        recall = isinstance(ctx.payload.extra, Recall)
        if ctx.state is not None:
            P.load_into(ctx.model, ctx.state.params)
        elif recall:
            raise RuntimeError(f"client {ctx.client_id} was asked for its kept model and has none")
        elif self.config.start_from == "client_init":
            if ctx.client_init is None:
                raise RuntimeError(
                    "local start_from: client_init needs the worker's ClientContext.client_init"
                )
            P.load_into(ctx.model, ctx.client_init())
        elif not ctx.global_params:
            raise RuntimeError(
                f"client {ctx.client_id} has no model of its own yet, and the broadcast is empty: "
                f"a round with such a client must broadcast the initial model"
            )
        if recall:  # the worker keeps the loaded model; under DP-SGD it released nothing
            spent = sample_counts(0, self.config.local.batch_size, 0) if ctx.sample_privacy else {}
            return ClientResult(update={}, weight=0.0, metrics=spent)
        _, metrics = train_client(ctx, self.config.local)
        params = P.clone(P.model_params(ctx.model))
        if not P.is_finite(params):  # kept as state, it would poison this client's later rounds
            raise NonFiniteError(
                f"client {ctx.client_id}'s model holds NaN or infinity in {P.nonfinite_names(params)[:5]}"
            )
        # nothing travels up: the update is empty, the model stays with the client
        return ClientResult(
            update={}, weight=examples_trained_on(metrics), metrics=metrics, state=OwnModel(params)
        )

    def aggregator(self) -> Sum[Params]:
        return Sum()

    def protocol(
        self, services: Services[Params | None], state: ServerState[TrainedClients]
    ) -> ServerState[TrainedClients]:
        for round_num in range(services.start_round, services.info.num_rounds):
            state, metrics = self.train_round(services, state, round_num)
            services.end_round(state, round_num, metrics)
        return state

    def train_round(
        self, services: Services[Params | None], state: ServerState[TrainedClients], round_num: int
    ) -> tuple[ServerState[TrainedClients], Metrics]:
        """One round: the cohort trains its own models; they are evaluated when evaluation is due."""
        start = time.perf_counter()
        cohort = services.cohort(round_num)
        trained = state.extra.trained
        everyone_has_one = bool(np.isin(cohort, trained.numpy()).all())
        starts_shared = self.config.start_from == "shared_init" and not everyone_has_one
        payload: Payload[Recall | None] = Payload({})
        if starts_shared:
            payload = self.payload(state, round_num, services.info)
        due = services.is_eval_round(round_num)  # the local models come to the driver only then
        output = services.train_cohort(payload, cohort, round_num, RoundOptions(keep_local_models=due))
        reported = [client.client_id for client in output.clients]  # failed clients kept nothing
        now_trained = torch.unique(torch.cat([trained, torch.tensor(reported, dtype=torch.int64)]))
        metrics = services.round_metrics(output, payload)  # as the round loop reports its cohort
        if due:
            rows = local_model_rows(services, output.local_models)
            if round_num == services.info.num_rounds - 1:  # the last round: every client's model
                rest = np.setdiff1d(now_trained.numpy(), list(output.local_models))
                rows += self.recalled_rows(services, rest, round_num)
            metrics |= local_model_metrics(rows)
        metrics["sys/round_s"] = time.perf_counter() - start
        return replace(state, extra=TrainedClients(now_trained)), metrics

    def recalled_rows(
        self, services: Services[Params | None], clients: np.ndarray, round_num: int
    ) -> list[EvalRows]:
        """The evaluation rows of the models these clients keep in their state, read back a cohort
        at a time so the driver never holds more models than a round's."""
        recall = Payload({}, extra=Recall())
        step = max(1, services.info.cohort_size)
        rows: list[EvalRows] = []
        for start in range(0, len(clients), step):
            output = services.train_cohort(
                recall, clients[start : start + step], round_num, RoundOptions(keep_local_models=True)
            )
            rows += local_model_rows(services, output.local_models)
        return rows


def local_model_rows(services: Services[Params | None], models: dict[int, NumpyParams]) -> list[EvalRows]:
    """Each local model on the central test set and on its own client's test split (None where
    there is no such data)."""
    clients = sorted(models)
    if not clients:
        return []
    points = [models[c] for c in clients]
    central = [rows[0] for rows in services.map_clients(MapRequest(EVALUATE, points, None))]
    own = services.map_clients(MapRequest(EVALUATE, points, clients, paired=True))[0]
    return list(zip(central, own))


def local_model_metrics(rows: list[EvalRows]) -> Metrics:
    """``eval/local/*``: the mean over the models on the central test set, and each on its own
    client's test split, summarized as ``eval/clients/*`` are."""
    metrics: Metrics = {}
    central_rows = [scores.without_sums(row) for row, _ in rows if row is not None]
    if central_rows:  # None: the dataset has no central test set
        metrics["eval/local/num_clients"] = float(len(central_rows))
        for key in sorted({k for row in central_rows for k in row} - {"num_examples"}):
            metrics[f"eval/local/{key}"] = float(np.mean([row[key] for row in central_rows if key in row]))
    own_rows = [row for _, row in rows if row is not None and row["num_examples"] > 0]
    return metrics | summarize_clients(own_rows, "eval/local/clients")  # as eval/clients/* are
