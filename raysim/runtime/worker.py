"""The worker: one resident model that trains many clients per call and returns one partial.

``ClientTrainer`` is plain Python. The serial backend calls it in-process; the Ray backend runs
it as a long-lived actor (``ray_workers.py``). Both therefore share exactly one implementation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import torch
from torch import nn

from raysim import params as P
from raysim import registry
from raysim.aggregate import Memory, placed
from raysim.algorithm import has_personal_model, vectorizes
from raysim.compress.upload import Uplink
from raysim.config import JobConfig, PersonalizationConfig
from raysim.config.job import noise_salt
from raysim.config.robust import UPDATE_ATTACKS
from raysim.data.round_data import TrainingData, with_validation_split
from raysim.data.store import ClientStore
from raysim.errors import NonFiniteError
from raysim.measure.evaluate import evaluate
from raysim.plugin_defaults import round_aggregator
from raysim.privacy.local_noise import release_result
from raysim.probe import ClientView, Probe, measured
from raysim.robust.attacks import attacked_result, job_malicious
from raysim.runtime.builders import build_algorithm, build_probes
from raysim.runtime.chunks import ChunkResults, ChunkSize, worker_vectorizes
from raysim.runtime.client_state import ClientStateStore
from raysim.runtime.device_reads import RetrainRound, RoundChecks, UnreadClient, defers_reads, read_clients
from raysim.runtime.map_tasks import map_units
from raysim.runtime.memory import PeakMemory, keep_round_memory
from raysim.runtime.personal import (
    client_init_params,
    evaluate_personal_clients,
    personalize,
    typed_client_state,
)
from raysim.runtime.phase_timer import PhaseTimer
from raysim.runtime.precision import local_precision, set_up_arithmetic
from raysim.runtime.resident_models import ResidentModels
from raysim.runtime.wire import WorkerReport, WorkerSetup, client_failure
from raysim.sampling import client_seed, noise_seed
from raysim.services import MapRequest, RoundOptions
from raysim.stop_request import honour_stop_request, raise_stop_request
from raysim.types import (
    ClientContext,
    ClientData,
    ClientFailure,
    ClientResult,
    Metrics,
    NumpyParams,
    Params,
    Payload,
    RoundOutput,
)

R = TypeVar("R")  # one ``map_clients`` result


class ClientTrainer:
    """Holds the model, the client store and the state store; trains clients one after another."""

    def __init__(self, setup: WorkerSetup) -> None:
        torch.set_num_threads(setup.num_threads)
        if setup.gpu_memory_fraction is not None and setup.device.startswith("cuda"):
            # Ray's GPU fractions are scheduling hints only: enforce this worker's share.
            torch.cuda.set_per_process_memory_fraction(setup.gpu_memory_fraction)
        registry.adopt(setup.plugins)  # before the job, whose sections name them
        self.job = JobConfig.from_dict(setup.job)
        self.device = torch.device(setup.device)
        set_up_arithmetic(self.job.resources, self.device)  # resources.precision, .deterministic
        self.store = with_validation_split(ClientStore.open(setup.store_path), self.job)
        self.stores = {"": self.store} | {
            name: ClientStore.open(path) for name, path in setup.transfer_stores.items()
        }
        self.states = ClientStateStore(setup.state_dir)
        self.uplink = Uplink.of(self.job, lambda c, r: self.states.get(c, before_round=r, device=self.device))
        self.algorithm = build_algorithm(self.job)
        self.probes = build_probes(self.job)
        self.noise_salt = noise_salt(self.job)  # privacy's noise: independent of another job's
        self.resident = ResidentModels(self.job, self.store.spec, self.store.num_clients, self.device)
        self.model, mixes = self.resident.model, self.resident.mixes
        self.training = TrainingData(self.job, self.store)  # capped, augmented, poisoned per round
        self.attackers = job_malicious(self.job, self.store.num_clients, UPDATE_ATTACKS)
        self.vectorizes = (
            not self.training.transforms
            and not mixes
            and worker_vectorizes(  # data as stored
                self.job, self.algorithm, self.model, self.device, self.store
            )
        )
        if self.device.type == "cpu":  # a client's model-sized temporaries reuse the last one's pages
            keep_round_memory()  # (a round's first client, measured, still trims the heap)
        self.timer = PhaseTimer()  # ``train`` starts one per round; this one times reads outside a round
        self.chunk_size = ChunkSize.for_worker(self.job, self.model, self.device, setup.gpu_memory_fraction)

    def train(
        self,
        payload: Payload,
        tasks: list[tuple[int, int]],
        round_num: int,
        options: RoundOptions,
        per_client: dict[int, Any] | None = None,
        memory: Callable[[], Memory] | None = None,
    ) -> WorkerReport:
        """Trains ``tasks`` ((cohort position, client id) pairs) in order; folds their results.

        The probes named in ``options`` measure each client before and after its training.
        ``per_client`` holds these clients' own payload parts where they travel apart from the
        shared payload (Ray); None: they are the payload's ``per_client``. ``memory`` gives where
        each attempt folds its partial's sums (a Ray worker's answer segment, ``aggregate.placed``).
        """
        if per_client is not None:
            payload = replace(payload, per_client=per_client)
        self.timer = PhaseTimer(self.device)
        # on a GPU the clients' checks and metrics are read back once per round (device_reads);
        # not where the encoder's memory of each client's update is kept at once (compression)
        defer = defers_reads(self.device) and not options.probes and not options.keep_local_models
        defer = defer and not self.uplink.keeps_state
        try:
            report = self._train_tasks(payload, tasks, round_num, options, RoundChecks(defer), memory)
        except RetrainRound:  # an update was not finite: again, each client checked at once
            report = self._train_tasks(payload, tasks, round_num, options, RoundChecks(False), memory)
        return replace(report, worker_times=[self.timer.times()])

    def _train_tasks(
        self,
        payload: Payload,
        tasks: list[tuple[int, int]],
        round_num: int,
        options: RoundOptions,
        checks: RoundChecks,
        memory: Callable[[], Memory] | None,
    ) -> WorkerReport:
        timer = self.timer
        aggregator = round_aggregator(self.algorithm, options.clipping, options.gathers)
        partial = aggregator.zero() if memory is None else placed(aggregator.zero(), memory())
        probes = {name: self.probes[name] for name in options.probes}
        probe_rows: dict[str, list[Metrics]] = {name: [] for name in probes}
        failures: list[ClientFailure] = []
        local_models: dict[int, NumpyParams] = {}
        trained: list[UnreadClient] = []  # their tensors read back once, after the round
        bytes_up = params_up = 0
        peak_bytes: float | None = None
        with timer.phase("broadcast"):  # once per round, not per client: the payload on this device
            global_params = {k: torch.as_tensor(v).to(self.device) for k, v in payload.params.items()}
            payload = replace(payload, extra=P.to_device(payload.extra, self.device))
        chunks = self._chunks(payload, global_params, tasks, round_num, options)
        for position, client_id in tasks:
            honour_stop_request()  # a SIGTERM the serial backend's client code swallowed
            t0 = time.perf_counter()
            try:
                budget = options.step_budgets.get(client_id)
                key = options.state_keys.get(client_id, round_num)  # asynchronous: its launch
                with timer.phase("training"):
                    if chunks is not None:
                        (result, seconds), rows = chunks.result(client_id), dict[str, Metrics]()
                    else:
                        # on a GPU every client (allocator counters, no sync); on a CPU the
                        # round's first: measuring returns the heap, which the next steps refault
                        measured = self.device.type == "cuda" or peak_bytes is None
                        peak = PeakMemory(self.device) if measured else None
                        with peak or contextlib.nullcontext():
                            result, rows = self._train_one(
                                payload, global_params, client_id, round_num, probes, budget, key
                            )
                        if peak is not None:
                            peak_bytes = max(peak_bytes or 0.0, peak.bytes)
                    checks.check(result)  # before its state is kept or its update folded
                    result, sent = self.uplink.send(result, client_id, key)  # compression.upload
                if result.state is not None:
                    with timer.phase("data_loading"):
                        self.states.put(client_id, key, result.state)
            except NonFiniteError as exc:
                failures.append(ClientFailure(client_id, position, exc, stage="update_check"))
                continue
            except RetrainRound:
                raise
            except Exception as exc:  # the driver applies the failure policy
                raise_stop_request(exc)
                failures.append(client_failure(client_id, position, exc))
                continue
            if self.job.privacy is not None and self.job.privacy.local is not None:
                # local DP: only the clipped, noised update leaves the client (raysim.privacy.local_noise)
                with timer.phase("training"):
                    seed = noise_seed(self.job.seed, key, client_id, self.noise_salt)
                    result = release_result(result, self.job.privacy.local, seed)
            if client_id in self.attackers and self.job.attack is not None:  # what it sends instead
                result = attacked_result(result, self.job.attack, self.job.seed, key, client_id)
            with timer.phase("reduce"):
                partial = aggregator.add(partial, position, result)
            for name, row in rows.items():
                probe_rows[name].append(row)
            if options.keep_local_models:
                # a copy: on the CPU the arrays would alias the resident model, which trains on
                local_models[client_id] = P.to_numpy(P.clone(P.model_params(self.model_of(client_id))))
            bytes_up += sent
            params_up += P.num_values(result.update)
            seconds = time.perf_counter() - t0 if chunks is None else seconds
            trained.append(UnreadClient(client_id, result.weight, seconds, result.metrics))
        with timer.phase("reduce"):
            checks.settle()
            clients = read_clients(trained)
            partial = P.to_cpu(partial)  # one device-to-host copy per worker per round
        return RoundOutput(
            aggregate=partial,
            clients=clients,
            failures=failures,
            probe_rows=probe_rows,
            local_models=local_models,
            bytes_up=bytes_up,
            params_up=params_up,
            client_peak_bytes=peak_bytes,
        )

    def _chunks(
        self,
        payload: Payload,
        params: Params,
        tasks: list[tuple[int, int]],
        round_num: int,
        options: RoundOptions,
    ) -> ChunkResults | None:
        """The round's clients trained in chunks (``engine.vectorize``); None: one by one."""
        algorithm, budgets = self.algorithm, options.step_budgets
        if not (self.vectorizes and vectorizes(algorithm)) or options.probes or options.keep_local_models:
            return None

        def train_chunk(ids: list[int]) -> list[ClientResult]:
            if params:
                P.load_into(self.model, params)
            self.model.train()
            keys = {c: options.state_keys.get(c, round_num) for c in ids}
            ctxs = [self._context(payload, params, c, round_num, budgets.get(c), keys[c]) for c in ids]
            with local_precision(self.job.resources, self.device):
                return algorithm.vectorized_update(ctxs)

        return ChunkResults(train_chunk, [client for _, client in tasks], self.chunk_size)

    def round_data(self, client_id: int, round_num: int) -> ClientData:
        """The client's training examples this round: all, or the seeded ``max_client_examples``."""
        with self.timer.phase("data_loading"):
            return self.training.round_data(client_id, round_num)

    def _train_one(
        self,
        payload: Payload,
        global_params: dict[str, torch.Tensor],
        client_id: int,
        round_num: int,
        probes: dict[str, Probe],
        step_budget: int | None,
        key: int,
    ) -> tuple[ClientResult, dict[str, Metrics]]:
        seed = client_seed(self.job.seed, key, client_id)
        model = self.model_of(client_id)
        if global_params:  # an empty broadcast: the plugin owns the model's weights
            P.load_into(model, global_params)  # in place: the model is never rebuilt
        else:
            self.resident.restore_initial(client_id)
        model.zero_grad(set_to_none=True)
        data = self.round_data(client_id, key)
        view = ClientView(
            client_id,
            round_num,
            model,
            data,
            self._evaluate,
            lambda: self.store.client_data(client_id, "test"),
        )
        before = {name: measured(probe.before_training, view) for name, probe in probes.items()}
        model.train()  # whatever ran before (evaluation, a probe, another plugin's loop)
        ctx = self._context(payload, global_params, client_id, round_num, step_budget, key, data)
        torch.manual_seed(seed)  # dropout and any other torch randomness in the plugin
        with local_precision(self.job.resources, self.device):
            result = self.algorithm.client_update(ctx)
        rows = {
            name: {"client_id": float(client_id), **before[name], **measured(probe.after_training, view)}
            for name, probe in probes.items()
        }
        return result, rows

    def _context(
        self,
        payload: Payload,
        params: Params,
        client_id: int,
        round_num: int,
        budget: int | None,
        key: int,
        data: ClientData | None = None,
    ) -> ClientContext:
        """The client's context on the resident model (its data read here unless given); ``key``
        keys its draws: the round, or an asynchronous client's launch (``round_num``: the version)."""
        own = payload.per_client.get(client_id)
        return ClientContext(
            client_id=client_id,
            round_num=round_num,
            model=self.model_of(client_id),
            payload=payload,
            global_params=params,
            data=data if data is not None else self.round_data(client_id, key),
            state=self._client_state(client_id, round_num),
            seed=client_seed(self.job.seed, key, client_id),
            device=self.device,
            spec=self.store.spec,
            client_init=lambda: self.client_init(client_id),
            step_budget=budget,
            client_payload=None if own is None else P.to_device(own, self.device),
            model_section=self.resident.section_of(client_id),
            model_of=self.model_of,
            sample_privacy=self.job.privacy.sample if self.job.privacy is not None else None,
            noise_salt=self.noise_salt,
        )

    def _client_state(self, client_id: int, round_num: int) -> object | None:
        """The client's state from an earlier round, as the plugin's ``ClientState`` (the store
        keeps the dict of its fields); None the first time."""
        with self.timer.phase("data_loading"):
            saved = self.states.get(client_id, before_round=round_num, device=self.device)
        return typed_client_state(self.algorithm, self.uplink.plugin_part(saved), client_id)

    def client_init(self, client_id: int) -> Params:
        """The client's own random initialisation (``ClientContext.client_init``)."""
        return client_init_params(self.job, self.store.spec, client_id, self.device)

    def _evaluate(self, data: ClientData) -> Metrics:
        return evaluate(self.model, data, self.store.spec, self.device, self.job.evaluation.batch_size)

    def personalize(
        self,
        params: NumpyParams,
        client_ids: list[int],
        config: PersonalizationConfig,
        round_num: int,
        store: str = "",
    ) -> list[Metrics]:
        """Each client's test split under the global model and after few-shot fine-tuning
        (``raysim.runtime.personal.personalize``)."""
        return personalize(
            self.model, self.stores[store], self.job, self.device, params, client_ids, config, round_num
        )

    def evaluate_personal(self, params: NumpyParams, client_ids: list[int], round_num: int) -> list[Metrics]:
        """Each client's test split under its own predictor: the plugin's ``personal_model`` of the
        global ``params`` and the client's newest state up to ``round_num``."""
        if not has_personal_model(self.algorithm):
            raise ValueError(f"algorithm {self.job.algorithm.name!r} has no personal_model to evaluate")
        return evaluate_personal_clients(
            self.algorithm,
            self.model,
            self.store,
            self.job,
            self.device,
            params,
            client_ids,
            round_num,
            lambda client_id: self._client_state(client_id, round_num + 1),
        )

    def map_units(self, request: MapRequest[R], units: list[tuple[int, int]]) -> list[R | None]:
        """``request.task`` for each (point index, client position) unit, in order (``map_tasks``)."""
        source = self.stores[request.store]
        model, spec = self.resident.for_section(request.model), source.spec
        return map_units(
            request,
            units,
            model,
            lambda at: self._unit_data(request, source, at),
            spec,
            self.device,
            self._batch_size,
        )

    @property
    def _batch_size(self) -> int:
        return self.job.evaluation.batch_size

    def _unit_data(self, request: MapRequest[Any], source: ClientStore, position: int) -> ClientData | None:
        if request.clients is None:
            return self.training.triggered if request.split == "triggered" else source.central_test()
        client_id = request.clients[position]
        if request.split == "round":
            if request.round_num is None:
                raise ValueError("split='round' needs the round_num whose data it means")
            return self.round_data(client_id, request.round_num)
        return source.client_data(client_id, request.split)  # type: ignore[arg-type]

    def model_of(self, client_id: int) -> nn.Module:
        """The resident model of the client's architecture (the job's model without model groups)."""
        return self.resident.of_client(client_id)
