"""pfl-research 0.6.0 on raysim's ``jobs/bench/pfl_cifar10.yaml`` shape: s/round, for a side-by-side figure.

1,000 clients of 50 random 3x32x32 float32 images (10 classes), pfl's CNN in PyTorch, FedAvg,
cohort 50, batch 10, one local epoch, lr 0.1, no evaluation, one torch thread a process. Two
processes through pfl's own torch.distributed (gloo) when started as:

    PFL_WORKER_ADDRESSES=localhost:8000,localhost:8001 PFL_WORKER_RANK=0 python pfl_cifar_shape.py &
    PFL_WORKER_ADDRESSES=localhost:8000,localhost:8001 PFL_WORKER_RANK=1 python pfl_cifar_shape.py

Rank 0 prints each central iteration's wall time (between two ``after_central_iteration`` calls)
and, as its last line, ``JSON {...}`` with the timed rounds (the first ``--warmup`` are left out).
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
from torch import nn

torch.set_num_threads(1)

from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402


class CNN(nn.Module):
    """pfl-research's CIFAR-10 benchmark CNN (raysim's ``cnn_pfl``), with pfl's loss and metrics."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(12544, 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, 10),
        )

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return nn.functional.cross_entropy(self(x), y)

    def metrics(self, x, y, eval=False):
        self.eval() if eval else self.train()
        loss = nn.functional.cross_entropy(self(x), y, reduction="sum").item()
        return {"loss": Weighted(loss, len(x))}


class RoundTimer(TrainingProcessCallback):
    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.t0 = time.perf_counter()

    def on_train_begin(self, *, model):
        self.t0 = time.perf_counter()
        return super().on_train_begin(model=model)

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        now = time.perf_counter()
        self.seconds.append(now - self.t0)
        self.t0 = now
        if int(os.environ.get("PFL_WORKER_RANK", "0")) == 0:
            print(f"round {central_iteration}: {self.seconds[-1]:.3f} s", flush=True)
        return super().after_central_iteration(aggregate_metrics, model, central_iteration=central_iteration)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--cohort", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    rng = np.random.default_rng(0)  # the same data on every rank
    x = rng.random((args.clients, args.examples, 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, size=(args.clients, args.examples))
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)

    def make_dataset(user_id):
        return Dataset(raw_data=[xs[user_id], ys[user_id]], user_id=user_id)

    data = FederatedDataset(make_dataset, get_user_sampler("random", list(range(args.clients))))
    torch.manual_seed(0)
    net = CNN()
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    params = NNAlgorithmParams(
        central_num_iterations=args.rounds,
        evaluation_frequency=10**9,  # iteration 0 % f == 0: with no val cohort, nothing evaluates
        train_cohort_size=args.cohort,
        val_cohort_size=0,
    )
    timer = RoundTimer()
    FederatedAveraging().run(
        algorithm_params=params,
        backend=SimulatedBackend(training_data=data, val_data=data, postprocessors=[]),
        model=model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=1, local_learning_rate=0.1, local_batch_size=10
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=10),
        callbacks=[timer],
        send_metrics_to_platform=False,
    )
    if int(os.environ.get("PFL_WORKER_RANK", "0")) == 0:
        timed = timer.seconds[args.warmup :]
        print("JSON " + json.dumps({"median_s": statistics.median(timed), "rounds_s": timed}), flush=True)


if __name__ == "__main__":
    main()
