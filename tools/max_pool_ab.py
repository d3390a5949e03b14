"""raysim's max-pool against torch's in raysim's own local training, paired per client.

Builds a job's first worker in this process (the serial backend, one torch thread) and reads its
clients' round-0 data. Trains each client twice from the same weights and the same seed: once
with the model's ``raysim.models.max_pool.MaxPool2d`` layers, once with ``nn.MaxPool2d`` swapped
in, in alternating order, after one untimed client on each side. Prints the median of the
per-client time ratios (raysim / torch) with its interquartile range, and checks that both sides
trained the same weights to the last bit. Then times evaluation alike: the model's forward
without gradients over those clients' examples in batches of 256, paired per pass, the logits
checked equal. Exits 1 where either side's bits differ. The job's
``algorithm.local.channels_last`` applies to training on both sides; set it on the command line
to measure either layout (evaluation runs the model as built, contiguous).

Usage (from the repository root; a job file or a bench file):
    python tools/max_pool_ab.py jobs/bench/pfl_cifar10.yaml [key=value ...]
    python tools/max_pool_ab.py jobs/bench/pfl_cifar10.yaml model.name=simple_cnn \
        algorithm.local.batch_size=64 algorithm.local.channels_last=off
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from conv_layout_ab import first_worker  # beside this script
from torch import nn

from raysim.models.max_pool import MaxPool2d
from raysim.train.local import train_local

SIDES: tuple[type[nn.MaxPool2d], ...] = (MaxPool2d, nn.MaxPool2d)  # raysim's pool, torch's


def main(path: str, overrides: list[str]) -> int:
    job, backend, local = first_worker(path, overrides)
    trainer = backend.trainer
    model, spec = trainer.model, trainer.store.spec
    pools: list[nn.Module] = [m for m in model.modules() if type(m) is MaxPool2d]
    if not pools:
        sys.exit(f"{job.model.name} has no raysim MaxPool2d layer to compare")
    start = {k: v.clone() for k, v in model.state_dict().items()}
    clients = [trainer.training.round_data(c, 0) for c in range(int(os.environ.get("CLIENTS", "10")))]
    for kind in SIDES:  # warm-up, untimed: the first steps pay for allocations and lazy set-up
        for pool in pools:
            pool.__class__ = kind
        train_local(model, clients[0], local, seed=0, spec=spec)
    ratios: list[float] = []
    seconds: dict[type, list[float]] = {MaxPool2d: [], nn.MaxPool2d: []}
    differ = 0
    for repeat in range(int(os.environ.get("REPEATS", "4"))):
        for i, data in enumerate(clients):
            took, trained = {}, {}
            for kind in SIDES if (repeat + i) % 2 else SIDES[::-1]:
                for pool in pools:
                    pool.__class__ = kind  # the same module, its forward raysim's or torch's
                model.load_state_dict(start)
                torch.manual_seed(i)  # the same dropout masks on both sides
                t0 = time.perf_counter()
                train_local(model, data, local, seed=i, spec=spec)
                took[kind] = time.perf_counter() - t0
                seconds[kind].append(took[kind])
                trained[kind] = [t.clone() for t in model.state_dict().values()]
            ratios.append(took[MaxPool2d] / took[nn.MaxPool2d])
            differ += not all(map(torch.equal, trained[MaxPool2d], trained[nn.MaxPool2d]))
    images = torch.cat([torch.as_tensor(data.arrays["x"]) for data in clients])
    eval_ratios, eval_seconds, eval_differ = evaluation_pairs(model, pools, images.split(256))
    backend.shutdown()
    print(
        f"{job.model.name} training (channels_last {local.channels_last}): raysim / torch max-pool "
        f"{spread(ratios)}, {len(ratios)} client pairs; ms a client "
        f"{statistics.median(seconds[MaxPool2d]) * 1e3:.1f} raysim, "
        f"{statistics.median(seconds[nn.MaxPool2d]) * 1e3:.1f} torch; trained weights "
        + ("identical in every pair" if not differ else f"DIFFER in {differ} pairs")
    )
    print(
        f"{job.model.name} evaluation ({len(images)} examples, batches of 256): raysim / torch "
        f"{spread(eval_ratios)}, {len(eval_ratios)} pass pairs; ms a pass "
        f"{statistics.median(eval_seconds[MaxPool2d]) * 1e3:.1f} raysim, "
        f"{statistics.median(eval_seconds[nn.MaxPool2d]) * 1e3:.1f} torch; logits "
        + ("identical in every pair" if not eval_differ else f"DIFFER in {eval_differ} pairs")
    )
    return 1 if differ or eval_differ else 0


@torch.no_grad()
def evaluation_pairs(
    model: nn.Module, pools: list[nn.Module], batches: tuple[torch.Tensor, ...]
) -> tuple[list[float], dict[type, list[float]], int]:
    """The model's forward over ``batches`` in eval mode, raysim's pools against torch's in
    alternating order: the per-pass time ratios, each side's seconds, the passes whose logits differ."""
    model.eval()
    ratios: list[float] = []
    seconds: dict[type, list[float]] = {MaxPool2d: [], nn.MaxPool2d: []}
    differ = 0
    for repeat in range(2 * int(os.environ.get("REPEATS", "4"))):
        took, logits = {}, {}
        for kind in SIDES if repeat % 2 else SIDES[::-1]:
            for pool in pools:
                pool.__class__ = kind
            t0 = time.perf_counter()
            logits[kind] = [model(batch) for batch in batches]
            took[kind] = time.perf_counter() - t0
            seconds[kind].append(took[kind])
        ratios.append(took[MaxPool2d] / took[nn.MaxPool2d])
        differ += not all(map(torch.equal, logits[MaxPool2d], logits[nn.MaxPool2d]))
    return ratios, seconds, differ


def spread(ratios: list[float]) -> str:
    """The median ratio and its interquartile range."""
    ordered, q = sorted(ratios), len(ratios) // 4
    return f"{statistics.median(ordered):.3f} (IQR {ordered[q]:.3f}-{ordered[-q - 1]:.3f})"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
