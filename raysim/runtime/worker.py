"""The worker: one resident model that trains many clients per call and returns one partial.

``ClientTrainer`` is plain Python. The serial backend calls it in-process; the Ray backend runs
it as a long-lived actor (``ray_backend.py``). Both therefore share exactly one implementation.
"""

from __future__ import annotations

import math
import pickle
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from raysim import params as P
from raysim.config import JobConfig, PersonalizationConfig
from raysim.data.store import ClientStore
from raysim.errors import ClientError, ConfigError, NonFiniteError
from raysim.local import LocalTrainConfig, cap_examples, evaluate, train_local
from raysim.runtime.client_state import ClientStateStore
from raysim.sampling import client_seed
from raysim.types import ClientContext, ClientData, ClientResult, Metrics, NumpyParams, Payload

_PERSONALIZE = 0x9E3779B97F4A7C15 & (2**63 - 1)  # a separate stream from the client's training


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker needs to build itself; plain values only (it crosses processes)."""

    job: dict[str, Any]  # JobConfig.to_dict(): the worker re-validates, plugins load locally
    store_path: str
    state_dir: str
    transfer_stores: dict[str, str] = field(default_factory=dict)  # evaluation-only datasets
    device: str = "cpu"
    num_threads: int = 1
    gpu_memory_fraction: float | None = None


@dataclass(frozen=True)
class ClientFailure:
    client_id: int
    position: int
    error: BaseException
    stage: str = "client_update"  # or "update_check": the update held NaN or infinity


@dataclass
class WorkerReport:
    """One worker's answer for one round."""

    partial: Any
    client_metrics: list[Metrics] = field(default_factory=list)
    failures: list[ClientFailure] = field(default_factory=list)
    barrier: list[Metrics] = field(default_factory=list)  # per client, when measured
    bytes_up: int = 0
    seconds: float = 0.0


def build_algorithm(job: JobConfig) -> Any:
    from raysim import registry

    return registry.get("algorithm", job.algorithm.name).factory(job.algorithm.config)


def build_job_model(job: JobConfig, spec: Any) -> torch.nn.Module:
    """The job's model, seeded so every process builds identical frozen weights.

    Raises:
        ConfigError: the model does not fit the dataset, or its pretrained files are missing.
    """
    from raysim.models import build_model

    torch.manual_seed(job.seed)
    try:
        return build_model(job.model.name, job.model.config, spec)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(
            [
                f"model: {job.model.name!r} cannot be built for dataset "
                f"{job.dataset.name!r} ({spec.task}, input {spec.input_shape}, "
                f"{spec.num_classes} classes): {exc}"
            ]
        ) from exc


class ClientTrainer:
    """Holds the model, the client store and the state store; trains clients one after another."""

    def __init__(self, setup: WorkerSetup) -> None:
        torch.set_num_threads(setup.num_threads)
        if setup.gpu_memory_fraction is not None and setup.device.startswith("cuda"):
            # Ray's GPU fractions are scheduling hints only: enforce this worker's share.
            torch.cuda.set_per_process_memory_fraction(setup.gpu_memory_fraction)
        self.job = JobConfig.from_dict(setup.job)
        self.device = torch.device(setup.device)
        self.store = ClientStore.open(setup.store_path)
        self.stores = {"": self.store} | {
            name: ClientStore.open(path) for name, path in setup.transfer_stores.items()
        }
        self.states = ClientStateStore(setup.state_dir)
        self.algorithm = build_algorithm(self.job)
        self.model = build_job_model(self.job, self.store.spec).to(self.device)

    def ping(self) -> str:
        return "ok"

    def train(
        self, payload: Payload, tasks: list[tuple[int, int]], round_num: int, measure_barrier: bool = False
    ) -> WorkerReport:
        """Trains ``tasks`` ((cohort position, client id) pairs) in order; folds their results.

        With ``measure_barrier`` each client's round data is also evaluated under the broadcast
        model and under its local model (the first two terms of the client-server barrier).
        """
        start = time.perf_counter()
        aggregator = self.algorithm.aggregator()
        report = WorkerReport(partial=aggregator.zero())
        # Once per round, not per client: the broadcast on this worker's device.
        global_params = {k: torch.as_tensor(v).to(self.device) for k, v in payload.params.items()}
        for position, client_id in tasks:
            t0 = time.perf_counter()
            try:
                result, barrier = self._train_one(
                    payload, global_params, client_id, round_num, measure_barrier
                )
                check_finite_result(result)  # before its state is kept or its update folded
                if result.state is not None:
                    self.states.put(client_id, round_num, result.state)
            except NonFiniteError as exc:
                report.failures.append(ClientFailure(client_id, position, exc, stage="update_check"))
                continue
            except Exception as exc:  # the driver applies the failure policy
                report.failures.append(ClientFailure(client_id, position, _shippable(exc)))
                continue
            report.partial = aggregator.add(report.partial, position, result)
            if barrier is not None:
                report.barrier.append(barrier)
            report.bytes_up += P.num_bytes(result.update)
            report.client_metrics.append(
                {
                    **result.metrics,
                    "client_id": float(client_id),
                    "weight": result.weight,
                    "seconds": time.perf_counter() - t0,
                }
            )
        report.partial = P.to_cpu(report.partial)  # one device-to-host copy per worker per round
        report.seconds = time.perf_counter() - start
        return report

    def round_data(self, client_id: int, round_num: int) -> ClientData:
        """The client's training examples this round: all, or the seeded ``max_client_examples``."""
        seed = client_seed(self.job.seed, round_num, client_id)
        return cap_examples(
            self.store.client_data(client_id, "train"), self.job.engine.max_client_examples, seed
        )

    def _train_one(
        self,
        payload: Payload,
        global_params: dict[str, torch.Tensor],
        client_id: int,
        round_num: int,
        measure_barrier: bool,
    ) -> tuple[Any, Metrics | None]:
        seed = client_seed(self.job.seed, round_num, client_id)
        P.load_into(self.model, global_params)  # in place: the model is never rebuilt
        self.model.train()  # whatever ran before (evaluation, another plugin's loop)
        self.model.zero_grad(set_to_none=True)
        data = self.round_data(client_id, round_num)
        start = self._evaluate(data) if measure_barrier else None
        self.model.train()  # the evaluation above switched to eval mode
        ctx = ClientContext(
            client_id=client_id,
            round_num=round_num,
            model=self.model,
            payload=payload,
            global_params=global_params,
            data=data,
            state=self.states.get(client_id, before_round=round_num),
            seed=seed,
            device=self.device,
            spec=self.store.spec,
        )
        torch.manual_seed(seed)  # dropout and any other torch randomness in the plugin
        result = self.algorithm.client_update(ctx)
        if start is None:
            return result, None
        local = self._evaluate(data)  # the model the client ended with
        return result, {
            "client_id": float(client_id),
            "start_loss": start["loss"],
            "start_accuracy": start["accuracy"],
            "local_loss": local["loss"],
            "local_accuracy": local["accuracy"],
        }

    def _evaluate(self, data: ClientData) -> Metrics:
        return evaluate(self.model, data, self.store.spec, self.device, self.job.engine.eval_batch_size)

    def personalize(
        self,
        params: NumpyParams,
        client_ids: list[int],
        config: PersonalizationConfig,
        round_num: int,
        store: str = "",
    ) -> list[Metrics]:
        """Each client's test split under the global model and after few-shot fine-tuning.

        A client fine-tunes a fresh copy of ``params`` on the first ``fraction`` of its data
        (from its train split, shuffled by the store's seed) for ``config.epochs`` epochs. Clients
        with fewer than ``config.min_examples`` examples are skipped.
        """
        source = self.stores[store]
        local = LocalTrainConfig(epochs=config.epochs, batch_size=config.batch_size, lr=config.lr)
        on_device = {k: torch.as_tensor(v).to(self.device) for k, v in params.items()}  # once
        out = []
        for client_id in client_ids:
            test, pool = source.client_data(client_id, "test"), source.client_data(client_id, "train")
            if not len(test) or len(test) + len(pool) < config.min_examples:
                continue
            P.load_into(self.model, on_device)
            row = {**self._evaluate(test), "client_id": float(client_id)}
            seed = client_seed(self.job.seed, round_num, client_id) ^ _PERSONALIZE
            for fraction in config.fractions:
                shots = min(int(round(fraction * (len(test) + len(pool)))), len(pool))
                P.load_into(self.model, on_device)  # every fraction starts from the global model
                self.model.train()
                self.model.zero_grad(set_to_none=True)
                torch.manual_seed(seed)  # dropout: the same whichever worker runs the client
                if shots:
                    train_local(
                        self.model,
                        ClientData({k: v[:shots] for k, v in pool.arrays.items()}),
                        local,
                        seed=seed,
                        spec=source.spec,
                        device=self.device,
                    )
                tuned = self._evaluate(test)
                tag = f"personalized_{round(fraction * 100)}"
                row |= {f"{tag}/accuracy": tuned["accuracy"], f"{tag}/loss": tuned["loss"]}
            out.append(row)
        return out

    def evaluate_clients(
        self,
        params: NumpyParams,
        client_ids: list[int],
        split: str = "test",
        round_num: int | None = None,
        store: str = "",
    ) -> list[Metrics]:
        """``params`` on each client's split (clients with no examples are skipped).

        ``split="round"`` is the client's training data of ``round_num`` (after the cap);
        ``store`` names a transfer dataset ("" is the training dataset).
        """
        P.load_into(self.model, params)
        out = []
        for client_id in client_ids:
            if split == "round":
                data = self.round_data(client_id, round_num)
            else:
                data = self.stores[store].client_data(client_id, split)
            if len(data):
                out.append({**self._evaluate(data), "client_id": float(client_id)})
        return out

    def evaluate_central(self, params: NumpyParams) -> Metrics | None:
        """The global model on the dataset's central test set, if it has one."""
        data = self.store.central_test()
        if data is None or not len(data):
            return None
        P.load_into(self.model, params)
        return evaluate(self.model, data, self.store.spec, self.device, self.job.engine.eval_batch_size)


def check_finite_result(result: ClientResult) -> None:
    """Refuses a client result whose update or weight holds NaN or infinity.

    One diverging client (a huge learning rate) would otherwise turn the whole aggregate, and so
    the global model, into NaN. The check is one reduction per tensor and one sync per client.

    Raises:
        NonFiniteError: naming the tensors that are not finite.
    """
    weight_is_finite = math.isfinite(float(result.weight))
    if weight_is_finite and P.is_finite(result.update):
        return
    bad = P.nonfinite_names(result.update) + ([] if weight_is_finite else ["weight"])
    raise NonFiniteError(
        f"the client's update holds NaN or infinity in {bad[:5]}{' ...' if len(bad) > 5 else ''}; "
        f"its local training diverged (lower the learning rate, or set local.grad_clip)"
    )


def _shippable(exc: Exception) -> Exception:
    """The exception itself when it pickles (it crosses to the driver), else one that keeps its
    type name, message and traceback text."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        trace = "".join(traceback.format_exception(exc))
        return RuntimeError(f"{type(exc).__name__}: {exc} (unpicklable; traceback follows)\n{trace}")


def raise_client_failure(failure: ClientFailure, round_num: int) -> None:
    raise ClientError(failure.client_id, round_num, failure.stage, failure.error) from failure.error
