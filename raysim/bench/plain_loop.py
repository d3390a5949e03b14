"""The plain loop: ``raysim bench``'s limit, one process training clients one after another.

``PlainLoop`` is one thread, one model, client data in memory, plain SGD and nothing else.
``ParallelPlainLoop`` runs it in one process per core raysim trains on, each on its share of the
cohort, started together: the loop's parallel time measured on this machine. The plain loop's time
divided by the cores assumes they scale perfectly; two cores training at once share
the last-level cache and the memory bandwidth (on a VM they may be two threads of one core), and
this side shows by how much, with nothing of raysim running (no engine, no Ray, no transfers).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from raysim.bench.bench_vectorized import synchronize
from raysim.config import JobConfig
from raysim.data.round_data import cap_examples
from raysim.data.store import ClientStore
from raysim.errors import ConfigError
from raysim.models.text import HFTokenModel
from raysim.plugin_defaults import local_section
from raysim.runtime.builders import build_job_model
from raysim.sampling import client_seed, sample_cohort
from raysim.train.local import LocalTrainConfig


def plain_local(job: JobConfig) -> LocalTrainConfig:
    """The plugin's local training section, which the plain loop repeats.

    Raises:
        ConfigError: the plugin has no ``local`` section of local SGD.
    """
    local = local_section(job.algorithm.config)
    if not isinstance(local, LocalTrainConfig):
        raise ConfigError(
            [f"algorithm: the plain loop repeats local SGD, and {job.algorithm.name!r} has no local section"]
        )
    return local


class PlainLoop:
    """The limit: one thread, one model, client data in memory (on the device), plain SGD, a
    float64 sum.

    Language models train through HuggingFace's own loss (``hf(input_ids, labels=input_ids)``);
    for FedFish the extra Fisher pass runs too and is timed apart (``fisher_s``).
    """

    def __init__(
        self,
        job: JobConfig,
        store: ClientStore,
        pool: np.ndarray,
        device: torch.device = torch.device("cpu"),
        share: tuple[int, int] = (0, 1),
    ) -> None:
        self.job, self.store, self.pool = job, store, pool  # pool: the clients that train
        self.share = share  # (index, count): this loop trains cohort[index::count]
        self.device = device
        self.model = build_job_model(job, store.spec).to(device)
        self.local = plain_local(job)
        self.global_state = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.fisher_s: list[float] = []
        self.tokens = 0  # tokens (or examples) trained in the last round

    def _loss(self, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        if self.store.spec.task == "causal_lm":
            assert isinstance(self.model, HFTokenModel)  # the one causal-LM model
            return self.model.hf(input_ids=x, labels=x).loss
        assert y is not None  # classification data has labels
        return F.cross_entropy(self.model(x), y)

    def _client_data(self, round_num: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The cohort's round data, capped exactly as raysim's workers cap it."""
        job = self.job
        cohort = self.pool[sample_cohort(len(self.pool), job.engine.cohort_size, job.seed, round_num)]
        index, count = self.share
        out = []
        for c in cohort[index::count]:
            data = cap_examples(
                self.store.client_data(int(c), "train"),
                job.engine.max_client_examples,
                client_seed(job.seed, round_num, int(c)),
            )
            y = data.arrays.get("y")
            x = torch.from_numpy(data.arrays["x"].copy()).to(self.device)
            out.append((x, None if y is None else torch.from_numpy(y.copy()).to(self.device)))
        return out

    def round(self, round_num: int, ready: Callable[[], Any] | None = None) -> float:
        """Trains the round's cohort (its share); returns its seconds (data loading excluded).

        ``ready`` is called once the data is loaded, just before the clock starts.
        """
        job, local = self.job, self.local
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        data = self._client_data(round_num)
        synchronize(self.device)
        if ready is not None:
            ready()
        t0 = time.perf_counter()
        model, start, fisher_s = self.model, self.global_state, 0.0
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in start.items()}
        for x, y in data:
            model.load_state_dict(start)
            model.train()
            optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=local.lr)
            for _ in range(local.epochs):
                order = torch.randperm(len(x), device=x.device)
                for begin in range(0, len(x), local.batch_size):
                    idx = order[begin : begin + local.batch_size]
                    optimizer.zero_grad()
                    self._loss(x[idx], None if y is None else y[idx]).backward()
                    optimizer.step()
            if job.algorithm.name == "fedfish":
                fisher_s += self._fisher_pass(x, y, local.batch_size)
            for k, v in model.state_dict().items():
                total[k] += (start[k] - v).double() * len(x)
        num_examples = sum(len(x) for x, _ in data)
        self.global_state = {k: start[k] - (total[k] / num_examples).to(v.dtype) for k, v in start.items()}
        synchronize(self.device)
        seconds = time.perf_counter() - t0
        torch.set_num_threads(threads)
        self.fisher_s.append(fisher_s)
        per_example = self.store.spec.input_shape[0] if self.store.spec.task == "causal_lm" else 1
        self.tokens = num_examples * local.epochs * per_example
        return seconds

    def count(self, round_num: int) -> float:
        """Reads the round's data and counts its tokens (or examples) without training
        (``bench.plain_loop: false``); 0.0 seconds."""
        data = self._client_data(round_num)
        per_example = self.store.spec.input_shape[0] if self.store.spec.task == "causal_lm" else 1
        self.tokens = sum(len(x) for x, _ in data) * self.local.epochs * per_example
        return 0.0

    def _fisher_pass(self, x: torch.Tensor, y: torch.Tensor | None, batch_size: int) -> float:
        """FedFish's extra pass: squared batch gradients summed, at the final local weights."""
        synchronize(self.device)
        t0 = time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        fisher = [torch.zeros_like(p) for p in params]
        for begin in range(0, len(x), batch_size):
            batch = slice(begin, begin + batch_size)
            self.model.zero_grad()
            self._loss(x[batch], None if y is None else y[batch]).backward()
            for f, p in zip(fisher, params):
                if p.grad is not None:  # a parameter the loss does not reach has none
                    f.add_(p.grad**2)
        synchronize(self.device)
        return time.perf_counter() - t0


class ParallelPlainLoop:
    """``PlainLoop`` in ``count`` processes at once, each on its share of every cohort.

    A round's time is the slowest process's, all starting together once their data is loaded.
    """

    def __init__(self, job: JobConfig, store: ClientStore, pool: np.ndarray, count: int) -> None:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads
        # kept: a child unpickles it after this returns, and a barrier collected here is gone
        self.barrier = barrier = context.Barrier(count)
        self.pipes: list[Connection] = []
        self.processes = []
        for index in range(count):
            parent, child = context.Pipe()
            process = context.Process(
                target=_serve, args=(job.to_dict(), store, pool, (index, count), barrier, child), daemon=True
            )
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)

    def round(self, round_num: int) -> float:
        for pipe in self.pipes:
            pipe.send(round_num)
        return max(pipe.recv() for pipe in self.pipes)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(timeout=30)


def _serve(
    job: dict[str, Any],  # JobConfig.to_dict(): validated again here, where plugins load
    store: ClientStore,
    pool: np.ndarray,
    share: tuple[int, int],
    barrier: Any,
    pipe: Connection,
) -> None:
    """One process of ``ParallelPlainLoop``: trains its share of each round it is sent."""
    loop = PlainLoop(JobConfig.from_dict(job), store, pool, share=share)
    while (round_num := pipe.recv()) is not None:
        pipe.send(loop.round(round_num, ready=barrier.wait))
