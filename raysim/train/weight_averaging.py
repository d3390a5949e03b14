"""Local weight averaging, shared by the soup baselines (``algorithms/swa.py``, ``algorithms/soups.py``).

A client that averages weights trains several points (a trajectory's snapshots, independent
fine-tunes) and uploads their mean. The pieces here are plain functions and two small classes:
a client's held-back examples to select by, a running mean of parameter sets, the greedy soup's selection, and
SWAD's overfit-aware averaging window (``LossValley``).

Usage:
    train, held_back = hold_back_for_selection(ctx.data, 0.2, ctx.seed)      # seeded per client and round
    average = RunningMean(); average.add(P.model_params(model)); load_params(model, average.mean())
    chosen = greedy_soup(val_accuracies, lambda members: soup_accuracy(members))
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raysim import params as P
from raysim.train.batching import iterate_batches, to_tensors
from raysim.types import ClientData, ClientMetrics, Params

_SPLIT_TAG = 0x5A1D  # keeps the held-back draw apart from the client's other random streams


def hold_back_for_selection(data: ClientData, fraction: float, seed: int) -> tuple[ClientData, ClientData]:
    """``(train, held_back)``: ``round(fraction * n)`` of the client's examples (at least one, and
    one left to train on) held back at random, a pure function of ``seed`` (the client's seed, drawn
    from the run seed, the round and the client). The training part keeps the data's batch
    transform (augmentation); the held-back part is read as stored.

    Raises:
        ValueError: fewer than two examples, so nothing can be held back.
    """
    n = len(data)
    if n < 2:
        raise ValueError(
            f"a client with {n} example(s) cannot hold back examples to select by: raise the "
            "partition's min_size, or set algorithm.selection_fraction: 0 where the method allows it"
        )
    num_val = min(max(1, round(fraction * n)), n - 1)
    order = np.random.default_rng([seed, _SPLIT_TAG]).permutation(n)
    val, train = np.sort(order[:num_val]), np.sort(order[num_val:])
    return (
        ClientData({k: v[train] for k, v in data.arrays.items()}, data.batch_transform),
        ClientData({k: v[val] for k, v in data.arrays.items()}),
    )


def snapshot(model: nn.Module) -> Params:
    """A detached copy of the tensors that travel (``raysim.params.model_params``)."""
    return {name: t.detach().clone() for name, t in P.model_params(model).items()}


def load_params(model: nn.Module, params: Mapping[str, torch.Tensor]) -> None:
    """Copies ``params`` into the model's tensors of the same names (parameters and buffers)."""
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, value in params.items():
            tensors[name].copy_(value)


def uniform_mean(members: Sequence[Mapping[str, torch.Tensor]]) -> Params:
    """The uniform average of parameter sets (the uniform soup)."""
    return {name: torch.stack([m[name] for m in members]).mean(0) for name in members[0]}


class RunningMean:
    """The mean of the parameter sets added so far, each weighted by ``count`` (Izmailov et al.'s
    ``w_swa <- (w_swa * n + w) / (n + 1)`` for unit counts), in float64 so that hundreds of dense
    updates lose no precision; ``mean()`` returns the sets' own dtypes."""

    def __init__(self) -> None:
        self._sum: dict[str, torch.Tensor] = {}
        self._dtypes: dict[str, torch.dtype] = {}
        self.count = 0.0

    def add(self, params: Mapping[str, torch.Tensor], count: float = 1.0) -> None:
        for name, value in params.items():
            term = value.detach().double() * count
            if name in self._sum:
                self._sum[name] += term
            else:
                self._sum[name], self._dtypes[name] = term, value.dtype
        self.count += count

    def mean(self) -> Params:
        assert self.count > 0, "the mean of nothing"
        return {name: (s / self.count).to(self._dtypes[name]) for name, s in self._sum.items()}


def greedy_soup(accuracies: Sequence[float], soup_accuracy: Callable[[list[int]], float]) -> list[int]:
    """Wortsman et al. 2022's greedy soup (Recipe 1): visit the ingredients by held-back accuracy,
    best first, and keep each one whose addition does not lower the soup's held-back accuracy.

    Args:
        accuracies: each ingredient's own held-back accuracy.
        soup_accuracy: the held-back accuracy of the uniform soup of the ingredients listed.

    Returns:
        the kept ingredients' indices, in the order they joined (the best one first).
    """
    order = sorted(range(len(accuracies)), key=lambda i: -accuracies[i])  # stable: ties keep index order
    chosen, best = [order[0]], accuracies[order[0]]
    for i in order[1:]:
        candidate = soup_accuracy([*chosen, i])
        if candidate >= best:
            chosen, best = [*chosen, i], candidate
    return chosen


@dataclass(frozen=True)
class Segment:
    """The dense average of the iterates between two held-back evaluations (SWAD)."""

    index: int  # the evaluation that closed it, 0-based
    mean: Params  # the mean of its iterates
    count: int  # its iterates
    loss: float  # the held-back loss at its last iterate


class LossValley:
    """SWAD's overfit-aware averaging window (Cha et al., NeurIPS 2021, arXiv:2102.08604, sec. 3.3),
    fed one ``Segment`` per held-back evaluation, in order.

    Averaging starts at the first evaluation ``s`` whose loss is the lowest of the ``start_window``
    evaluations from it on (the loss has stopped falling) and ends before the first evaluation
    ``e > s`` from which ``end_window`` losses in a row exceed ``tolerance * loss_s`` (overfitting);
    the segments ``s .. e - 1`` are averaged, weighted by their iterates. Windows that reach past the
    end of training are cut at it (``finish``). Only undecided segments are held: at most
    ``max(start_window, end_window)`` parameter sets.
    """

    def __init__(self, start_window: int, end_window: int, tolerance: float) -> None:
        self.start_window, self.end_window, self.tolerance = start_window, end_window, tolerance
        self.start: int | None = None
        self.end: int | None = None  # the first segment left out, once overfitting is seen
        self.averaged: list[int] = []
        self._pending: deque[Segment] = deque()
        self._average = RunningMean()
        self._threshold = math.inf

    def add(self, segment: Segment) -> None:
        if self.end is None:
            self._pending.append(segment)
            self._advance(is_final=False)

    def finish(self) -> Params | None:
        """The average over the window (None: no segment at all)."""
        self._advance(is_final=True)
        return self._average.mean() if self.averaged else None

    def _advance(self, is_final: bool) -> None:
        pending = self._pending
        while self.start is None and pending:
            window = list(pending)[: self.start_window]
            if len(window) < self.start_window and not is_final:
                return
            if pending[0].loss <= min(s.loss for s in window):
                self.start, self._threshold = pending[0].index, self.tolerance * pending[0].loss
            else:
                pending.popleft()  # a later loss in its window is lower: not where the valley starts
        while self.start is not None and self.end is None and pending:
            window = list(pending)[: self.end_window]
            if len(window) < self.end_window and not is_final:
                return
            if min(s.loss for s in window) > self._threshold:
                self.end = pending[0].index
                pending.clear()
                return
            segment = pending.popleft()
            self._average.add(segment.mean, segment.count)
            self.averaged.append(segment.index)


def recompute_batchnorm(
    model: nn.Module, data: ClientData, batch_size: int, device: torch.device | str
) -> bool:
    """Recomputes BatchNorm running statistics at the model's current (averaged) weights with one
    pass over ``data`` (Izmailov et al. 2018, sec. 3.2: averaged weights need their own statistics),
    through ``torch.optim.swa_utils.update_bn``. Returns whether the model has BatchNorm at all."""
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return False
    if len(data) < 2:  # one example has no batch statistics: the averaged ones stay
        return True
    batches = [batch["x"] for batch in iterate_batches(to_tensors(data, device), batch_size, merge_lone=True)]
    torch.optim.swa_utils.update_bn(batches, model)
    return True


def merge_train_metrics(runs: Sequence[ClientMetrics]) -> ClientMetrics:
    """``train_local`` metrics of several runs of one client as one: loss and accuracy are the
    step-weighted means, steps the sum, ``train/num_examples`` the most any run saw."""
    steps = sum(float(run["train/steps"]) for run in runs)  # counts: host floats
    return {
        "train/loss": sum(run["train/loss"] * run["train/steps"] for run in runs) / max(steps, 1.0),
        "train/accuracy": sum(run["train/accuracy"] * run["train/steps"] for run in runs) / max(steps, 1.0),
        "train/steps": float(steps),
        "train/num_examples": max((float(run["train/num_examples"]) for run in runs), default=0.0),
    }
