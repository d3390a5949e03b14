"""What a run's evaluations look at, settled once before its first round: the clients each
evaluation draws from the run seed (``EvaluationPlan``), and the transfer datasets, each checked to
look like the training data to the model (the same input shape, classes and tokenizer).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from raysim.config import JobConfig
from raysim.config.plugins import section_config
from raysim.data.prepare import open_dataset
from raysim.data.round_data import dataset_options
from raysim.data.store import ClientStore
from raysim.engine.domain_scores import client_domains
from raysim.engine.evaluation import EvaluationPlan
from raysim.errors import ConfigError
from raysim.sampling import sample_eval_clients


def evaluation_plan(
    job: JobConfig,
    train_pool: np.ndarray,
    heldout: np.ndarray,
    transfer: dict[str, ClientStore],
    with_client_state: bool = False,
    store: ClientStore | None = None,
) -> EvaluationPlan:
    """Which clients each evaluation looks at, drawn once from the run seed; ``with_client_state``:
    the evaluated training clients are also evaluated with their own state (``eval/personal``);
    ``store``: the training data, whose domains (if partitioned by domain) group them (``eval/domain``)."""
    evaluation = job.evaluation
    clients = train_pool[sample_eval_clients(len(train_pool), evaluation.clients, job.seed)]
    return EvaluationPlan(
        clients=clients,
        heldout=heldout[sample_eval_clients(len(heldout), evaluation.heldout_clients, job.seed)],
        personalization=evaluation.personalization,
        transfer={
            t.name: sample_eval_clients(transfer[t.name].num_clients, t.eval_clients, job.seed)
            for t in evaluation.transfer
        },
        personalize_transfer=frozenset(t.name for t in evaluation.transfer if t.personalize),
        backdoor=dataset_options(job).poison is not None,
        flip_success=job.attack is not None and job.attack.kind == "label_flip",
        validation=dataset_options(job).validation_fraction > 0,
        with_client_state=with_client_state,
        domain_of=client_domains(store, clients) if store is not None else {},
    )


def tokenizer_identity(store: ClientStore) -> str | None:
    """What a text store's token ids mean: a digest of its saved tokenizer (None: not text)."""
    saved = store.meta.get("tokenizer")
    if not saved:
        return None
    digest = hashlib.sha256(json.dumps(saved["config"], sort_keys=True).encode())
    files = (
        [p for p in sorted((store.path / saved["file"]).rglob("*")) if p.is_file()]
        if saved.get("file") and (store.path / saved["file"]).is_dir()
        else [store.path / saved["file"]]
        if saved.get("file")
        else []
    )
    for path in files:  # a BPE trained per corpus differs in its merges, not its config
        digest.update(path.read_bytes())
    return digest.hexdigest()


def open_transfer_stores(job: JobConfig, store: ClientStore) -> dict[str, ClientStore]:
    """The evaluation-only datasets; each must look like the training data to the model."""
    stores = {}
    for i, transfer in enumerate(job.evaluation.transfer):
        config = section_config("dataset", transfer.dataset, f"evaluation.transfer[{i}].dataset.")
        other = open_dataset(transfer.dataset["name"], config)
        if (other.spec.task, other.spec.input_shape, other.spec.num_classes) != (
            store.spec.task,
            store.spec.input_shape,
            store.spec.num_classes,
        ):
            raise ConfigError(
                [
                    f"evaluation.transfer[{i}]: {transfer.name!r} holds {other.spec}, the "
                    f"model is built for {store.spec}"
                ]
            )
        if tokenizer_identity(other) != tokenizer_identity(store):
            raise ConfigError(
                [
                    f"evaluation.transfer[{i}]: {transfer.name!r} is tokenized differently "
                    f"from the training data (the same ids would mean other words); give "
                    f"both the same tokenizer, e.g. tokenizer: {{kind: hf, name_or_path: ...}}"
                ]
            )
        stores[transfer.name] = other
    return stores
