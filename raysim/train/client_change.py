"""A plugin's change to local training, stated once for both trainers: ``ClientChange``, the
functions a chunk's clients share, and ``PerClient``, what is each client's own.

A change is written over one client's tensors by name, with no client axis. ``train_local``
applies it to the model's named parameters; ``train_local_vectorized`` applies the same functions
under ``torch.func.vmap`` to a chunk's stacked parameters. It has three parts, each optional:

- ``edit(weights, grads, own) -> grads`` edits the gradients after every backward pass, before
  clipping: FedProx's proximal gradient, SCAFFOLD's control-variate correction.
- ``passes``: each batch takes one optimizer step per pass. A pass returns the objective to
  differentiate from ``task`` (the task loss at any weights and buffers), the client's weights
  and buffers and its ``draws`` for the batch: FedGuCci's task step then one step per anchor, or
  its joint loss. The default, ``(task_pass,)``, is the plain task loss.
- ``watch(grads, acc, own, step) -> acc`` sees the gradients of every backward pass, as edited,
  before clipping, and returns the client's new accumulator (``acc`` holds its start); ``step``
  counts the client's backward passes before this one. The trainers hand the final accumulators
  back: FedFish's last-epoch Fisher sums.

A trainer takes one ``ClientChange`` for all its clients: what its functions close over
(FedProx's mu and anchor, FedGuCci's anchors) is the same for every client, by its type. What
differs per client is a ``PerClient``: ``own``, its tensors (SCAFFOLD's ``c - c_i``), and ``acc``,
its watch's start, which the vectorized trainer stacks along the client axis, and ``draw``, its
numbers for its next batch (FedGuCci's alphas), drawn on the host once per batch.

Usage:
    change = ClientChange(edit=corrected_gradient)
    delta, metrics = train_client(ctx, config, LocalHooks(change=change, client=PerClient(own=c - c_i)))
    results = train_clients(ctxs, config, change=change, client=lambda ctx: PerClient(...))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import vmap

from raysim.train.at_weights import at_weights

Weights = dict[str, torch.Tensor]  # one client's tensors by name (no client axis)
# A batch's mean loss, #correct and #predictions; the counts may stay tensors on the device.
BatchLoss = tuple[torch.Tensor, torch.Tensor | int, torch.Tensor | int]
TaskLoss = Callable[[Weights, Weights], BatchLoss]  # the task loss on the batch at (weights, buffers)
# the objective to differentiate, and the task loss the metrics count
Losses = tuple[torch.Tensor, BatchLoss]
# the client's numbers for a batch: Python floats in train_local, a tensor row under vmap
Draws = Sequence[float] | torch.Tensor
Pass = Callable[[TaskLoss, Weights, Weights, Draws], Losses]
GradientEdit = Callable[[Weights, Weights, Weights], Weights]  # (weights, grads, own) -> grads
Watch = Callable[[Weights, Weights, Weights, int], Weights]  # (grads, acc, own, step) -> acc


def task_pass(task: TaskLoss, weights: Weights, buffers: Weights, draws: Draws) -> Losses:
    """The default pass: the task loss at the client's weights (``gradient_step``'s objective)."""
    losses = task(weights, buffers)
    return losses[0], losses


@dataclass(frozen=True)
class ClientChange:
    """The functions of a change to local training, shared by the clients (the module docstring).

    Attributes:
        edit: ``(weights, grads, own) -> grads``, after every backward pass, before clipping;
            pure (no state, no in-place writes), as ``vmap`` runs it.
        passes: one optimizer step each per batch; the metrics count the first pass's task loss.
        watch: ``(grads, acc, own, step) -> acc`` after every backward pass (after ``edit``); pure.
    """

    edit: GradientEdit | None = None
    passes: tuple[Pass, ...] = (task_pass,)
    watch: Watch | None = None


@dataclass(frozen=True)
class PerClient:
    """What one client brings to a ``ClientChange``: the values its functions are given.

    Attributes:
        own: the client's own tensors that ``edit`` and ``watch`` read.
        acc: the client's accumulator before its first backward pass (``watch``'s).
        draw: the client's numbers for its next batch, which every pass receives.
    """

    own: Weights = field(default_factory=dict)
    acc: Weights = field(default_factory=dict)
    draw: Callable[[], Sequence[float]] | None = None

    def next_draws(self) -> Sequence[float]:
        """The client's numbers for its next batch (none without ``draw``)."""
        return self.draw() if self.draw is not None else ()


def edit_model_gradients(change: ClientChange, client: PerClient, model: nn.Module) -> None:
    """``change.edit`` on ``model``'s ``.grad`` (``train_local``'s side)."""
    if change.edit is None:
        return
    named = {name: p for name, p in model.named_parameters() if p.grad is not None}
    grads = {name: p.grad for name, p in named.items() if p.grad is not None}
    edited = change.edit({name: p.detach() for name, p in named.items()}, grads, client.own)
    for name, p in named.items():
        p.grad = edited[name]


class ModelWatch:
    """``change.watch`` over ``train_local``'s backward passes; ``acc`` is the accumulator so far."""

    def __init__(self, change: ClientChange, client: PerClient) -> None:
        self.change, self.own, self.acc, self.step = change, client.own, dict(client.acc), 0

    def __call__(self, model: nn.Module) -> None:
        if self.change.watch is None:
            return
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        self.acc = self.change.watch(grads, self.acc, self.own, self.step)
        self.step += 1


def model_pass(
    one_pass: Pass, model: nn.Module, model_loss: Callable[[nn.Module], BatchLoss], draws: Draws
) -> Losses:
    """``one_pass`` on the live ``model`` (``train_local``'s side): ``task`` at the model's own
    trainable parameters and buffers is ``model_loss(model)`` itself; at any other weights it runs
    the model through ``functional_call`` (``raysim.train.at_weights``), so autograd reaches them."""
    if one_pass is task_pass:  # the plain objective: no dicts to build
        return task_pass(lambda weights, buffers: model_loss(model), {}, {}, draws)
    weights: Weights = {name: p for name, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())

    def task(at: Weights, at_buffers: Weights) -> BatchLoss:
        if at is weights and at_buffers is buffers:
            return model_loss(model)
        return model_loss(at_weights(model, at | at_buffers))

    return one_pass(task, weights, buffers, draws)


def stack_own(clients: Sequence[PerClient]) -> Weights:
    """The clients' ``own`` tensors stacked along the client axis (``[clients, ...]``)."""
    return {k: torch.stack([client.own[k] for client in clients]) for k in clients[0].own}


def stack_acc(clients: Sequence[PerClient]) -> Weights:
    """The clients' starting ``acc`` stacked along the client axis (``[clients, ...]``)."""
    return {k: torch.stack([client.acc[k] for client in clients]) for k in clients[0].acc}


def edit_stacked_gradients(change: ClientChange, params: Weights, grads: Weights, own: Weights) -> Weights:
    """``change.edit`` for the clients of a step at once (``train_local_vectorized``'s side):
    ``params``, ``grads`` and ``own`` stacked ``[clients, ...]``."""
    if change.edit is None:
        return grads
    edited: Weights = vmap(change.edit)(params, grads, own)
    return edited


def watch_stacked_(
    change: ClientChange, acc: Weights, grads: Weights, own: Weights, index: torch.Tensor, step: int
) -> None:
    """``change.watch`` for the clients of a step at once (``train_local_vectorized``'s side):
    ``grads`` and ``own`` hold those clients, ``acc`` the whole chunk (``index``: their positions
    in it), updated in place. Every client of a step has taken ``step`` backward passes before."""
    if change.watch is None:
        return
    watch = change.watch
    mine = {k: v.index_select(0, index) for k, v in acc.items()}
    seen: Weights = vmap(lambda g, a, o: watch(g, a, o, step))(grads, mine, own)
    for k, v in acc.items():
        v.index_copy_(0, index, seen[k])
