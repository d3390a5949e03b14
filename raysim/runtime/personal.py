"""A client's own side of a worker: its state typed as the plugin keeps it, its own initial
model, few-shot personalization (the global model fine-tuned on a client's data) and the
evaluation of its own predictor (the plugin's ``personal_model`` of the global model and its state).

``ClientTrainer`` (``raysim.runtime.worker``) calls these with its resident model; they never
build a model per client (only ``client_init_params`` builds one, the client's own start).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from raysim import params as P
from raysim.algorithm import AnyAlgorithm, PersonalAlgorithm
from raysim.config import JobConfig, PersonalizationConfig
from raysim.data.store import ClientStore
from raysim.errors import DataError
from raysim.measure.evaluate import evaluate
from raysim.plugin_defaults import client_state_type
from raysim.runtime.builders import build_job_model
from raysim.runtime.precision import local_precision
from raysim.sampling import client_seed
from raysim.stored import from_plain
from raysim.train.local import LocalTrainConfig, train_local
from raysim.types import ClientContext, ClientData, DataSpec, Metrics, NumpyParams, Params, Payload

_PERSONALIZE = 0x9E3779B97F4A7C15 & (2**63 - 1)  # a separate stream from the client's training
_CLIENT_INIT = 0x5851F42D4C957F2D & (2**63 - 1)  # a client's own initial model: yet another stream
_PERSONAL_MODEL = 0x2545F4914F6CDD1D & (2**63 - 1)  # what personal_model draws (a head's fine-tune)


def typed_client_state(algorithm: AnyAlgorithm[Any], saved: Any | None, client_id: int) -> object | None:
    """A client's stored state (the dict of its fields) as the plugin's ``ClientState``; None the
    first time, and the dict as stored where the plugin names no type.

    Raises:
        DataError: the stored fields are not the plugin's (another algorithm wrote them).
    """
    kind = client_state_type(algorithm)
    if saved is None or kind is None:
        return saved
    try:
        return from_plain(kind, saved, f"client {client_id}'s state")
    except ValueError as exc:
        why = "it was written by another algorithm, or an older version of it"
        raise DataError(f"{exc}: {why}") from None


def client_init_params(job: JobConfig, spec: DataSpec, client_id: int, device: torch.device) -> Params:
    """The client's own random initialisation (``ClientContext.client_init``): the job's model
    built by its factory under a seed of (run seed, client id), on ``device``."""
    seed = client_seed(job.seed, 0, client_id) ^ _CLIENT_INIT
    with torch.random.fork_rng(devices=[]):  # the plugin's torch random stream goes on as it was
        fresh = build_job_model(job, spec, seed)
    return {k: v.detach().to(device) for k, v in P.model_params(fresh).items()}


def personalize(
    model: nn.Module,
    source: ClientStore,
    job: JobConfig,
    device: torch.device,
    params: NumpyParams,
    client_ids: list[int],
    config: PersonalizationConfig,
    round_num: int,
) -> list[Metrics]:
    """Each client's test split under the global model and after few-shot fine-tuning.

    A client fine-tunes a fresh copy of ``params`` (in ``model``, on ``device``) on the first
    ``fraction`` of its data (from its train split, shuffled by the store's seed) for
    ``config.epochs`` epochs. Clients with fewer than ``config.min_examples`` examples are skipped.
    """
    local = LocalTrainConfig(epochs=config.epochs, batch_size=config.batch_size, lr=config.lr)
    on_device = {k: torch.as_tensor(v).to(device) for k, v in params.items()}  # once
    batch_size = job.evaluation.batch_size
    out = []
    for client_id in client_ids:
        test, pool = source.client_data(client_id, "test"), source.client_data(client_id, "train")
        if not config.admits(len(pool), len(test)):
            continue
        P.load_into(model, on_device)
        row = {**evaluate(model, test, source.spec, device, batch_size), "client_id": float(client_id)}
        seed = client_seed(job.seed, round_num, client_id) ^ _PERSONALIZE
        for fraction in config.fractions:
            shots = min(int(round(fraction * (len(test) + len(pool)))), len(pool))
            P.load_into(model, on_device)  # every fraction starts from the global model
            model.train()
            model.zero_grad(set_to_none=True)
            torch.manual_seed(seed)  # dropout: the same whichever worker runs the client
            if shots:
                shot_data = ClientData({k: v[:shots] for k, v in pool.arrays.items()})
                train_local(model, shot_data, local, seed=seed, spec=source.spec, device=device)
            tuned = evaluate(model, test, source.spec, device, batch_size)
            tag = f"personalized_{round(fraction * 100)}"
            # a regression task has no accuracy
            row |= {f"{tag}/{k}": tuned[k] for k in ("accuracy", "loss") if k in tuned}
        out.append(row)
    return out


def personal_context(
    model: nn.Module,
    source: ClientStore,
    job: JobConfig,
    device: torch.device,
    params: Params,
    client_id: int,
    round_num: int,
    state: object | None,
) -> ClientContext:
    """The context ``personal_model`` reads: ``model`` loaded with the global ``params`` (on
    ``device``) in train mode, the client's whole train split and its state up to ``round_num``."""
    P.load_into(model, params)
    model.train()
    model.zero_grad(set_to_none=True)
    return ClientContext(
        client_id=client_id,
        round_num=round_num,
        model=model,
        payload=Payload(P.to_numpy(params)),
        global_params=params,
        data=source.client_data(client_id, "train"),
        state=state,
        seed=client_seed(job.seed, round_num, client_id) ^ _PERSONAL_MODEL,
        device=device,
        spec=source.spec,
    )


def evaluate_personal_clients(
    algorithm: PersonalAlgorithm[Any],
    model: nn.Module,
    source: ClientStore,
    job: JobConfig,
    device: torch.device,
    params: NumpyParams,
    client_ids: list[int],
    round_num: int,
    state_of: Callable[[int], object | None],
) -> list[Metrics]:
    """Each client's test split under its own predictor (``evaluate_personal_model``): the global
    ``params`` and ``state_of(client)``, its newest state up to ``round_num``; clients without a
    test split are skipped."""
    on_device = {k: torch.as_tensor(v).to(device) for k, v in params.items()}  # once
    rows = []
    for client_id in client_ids:
        test = source.client_data(client_id, "test")
        if not len(test):
            continue
        ctx = personal_context(
            model, source, job, device, on_device, client_id, round_num, state_of(client_id)
        )
        with local_precision(job.resources, device):
            row = evaluate_personal_model(algorithm, ctx, test, job.evaluation.batch_size)
        rows.append({**row, "client_id": float(client_id)})
    return rows


def evaluate_personal_model(
    algorithm: PersonalAlgorithm[Any], ctx: ClientContext, test: ClientData, batch_size: int
) -> Metrics:
    """The client's own predictor (``algorithm.personal_model(ctx)``) on its ``test`` split."""
    torch.manual_seed(ctx.seed)  # dropout in a fine-tune: the same whichever worker runs the client
    personal = algorithm.personal_model(ctx)
    return evaluate(personal, test, ctx.spec, ctx.device, batch_size)
