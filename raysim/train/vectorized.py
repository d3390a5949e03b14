"""Trains a chunk of clients at once: ``train_local`` for K clients in one ``torch.func.vmap``.

Each client's trainable parameters, buffers (BatchNorm statistics) and optimizer state are
stacked along a leading client axis; one step runs ``vmap(grad(functional_call))`` over a
``[K, batch, ...]`` input and steps every client's optimizer with tensor ops on the stacks. Each
client keeps ``train_local``'s semantics: its own shuffling (drawn from its seed exactly as
``iterate_batches`` draws it), its epochs, ``max_steps`` and step budget, the last short batch of
an epoch (no drop_last), the lr of the round, gradient clipping and SGD (momentum, weight decay)
or Adam as ``torch.optim`` computes them. A step trains only the clients that still have a batch,
grouped by batch size, so a client that has run out of batches does not move and its optimizer
state does not change, and BatchNorm sees exactly its own batch (no padding). Plugins change
training through the ``ClientChange`` they also give ``train_local`` (``raysim.train.client_change``:
a gradient ``edit``, per-batch ``passes`` and a ``watch`` of the gradients, run under ``vmap``),
one for the chunk, with each client's ``PerClient`` values.

What cannot vectorize is refused by ``raysim.train.vectorizable.vectorization_blocker``: randomness
inside the model other than ``nn.Dropout``, whose masks ``raysim.train.hashed_dropout`` draws from
each client's seed, what ``vmap`` cannot batch, parameters the forward never uses; and so is a
client's ``batch_transform``, which draws per batch one client at a time.

Usage:
    results = train_clients(ctxs, LocalTrainConfig(lr=0.1))      # [(delta, metrics)] per client
    results = train_clients(ctxs, local, change=change, client=self.per_client)  # shared, and each's
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from raysim import params as P
from raysim.train.batching import Batch, batch_plan, has_batchnorm, lone_example, to_tensors
from raysim.train.client_change import (
    ClientChange,
    Losses,
    Pass,
    PerClient,
    edit_stacked_gradients,
    stack_acc,
    stack_own,
    task_pass,
    watch_stacked_,
)
from raysim.train.hashed_dropout import HashedDropout
from raysim.train.local import LocalTrainConfig, round_epochs, round_lr, step_limit
from raysim.train.task_loss import outputs_loss
from raysim.train.vectorizable import vectorization_blocker
from raysim.types import ClientContext, ClientData, DataSpec, Metrics, Params

Stacked = dict[str, torch.Tensor]  # per name, one tensor of shape [clients, ...]
ClientOf = Callable[[ClientContext], PerClient]  # one client's values for the shared change


@dataclass
class _Chunk:
    """The chunk's stacked state: trainable parameters, buffers and optimizer state."""

    params: Stacked
    buffers: Stacked
    moments: dict[str, Stacked]  # SGD: {"momentum"}; Adam: {"exp_avg", "exp_avg_sq"}

    def take(self, clients: torch.Tensor | None) -> _Chunk:
        if clients is None:
            return self
        pick = lambda stack: {k: v.index_select(0, clients) for k, v in stack.items()}  # noqa: E731
        return _Chunk(pick(self.params), pick(self.buffers), {m: pick(s) for m, s in self.moments.items()})

    def put(self, clients: torch.Tensor | None, part: _Chunk) -> None:
        if clients is None:
            return
        for stack, new in [(self.params, part.params), (self.buffers, part.buffers)] + [
            (self.moments[m], part.moments[m]) for m in self.moments
        ]:
            for k, v in stack.items():
                v.index_copy_(0, clients, new[k])


def train_clients(
    ctxs: Sequence[ClientContext],
    config: LocalTrainConfig,
    *,
    change: ClientChange = ClientChange(),
    client: ClientOf | None = None,
) -> list[tuple[Params, Metrics]]:
    """``train_client`` for every context at once: ``(delta, metrics)`` per client, in order.

    All contexts share one round, device, spec and resident model (``ctxs[0].model``, holding the
    broadcast weights, which it keeps); each brings its data, seed and step budget. The hooks are
    ``train_local_vectorized``'s.
    """
    trained, metrics, _ = train_contexts(ctxs, config, change=change, client=client)
    return [(client_delta(ctx, trained, i), metrics[i]) for i, ctx in enumerate(ctxs)]


def train_contexts(
    ctxs: Sequence[ClientContext],
    config: LocalTrainConfig,
    *,
    change: ClientChange = ClientChange(),
    client: ClientOf | None = None,
) -> tuple[Stacked, list[Metrics], Stacked]:
    """``train_local_vectorized`` of the contexts' clients: their trained weights, stacked, their
    metrics and their watches' final accumulators, stacked (``train_clients`` for a plugin that
    needs the weights or the accumulators: FedFish's Fisher pass, its last-epoch Fisher).
    ``change`` and ``client(ctx)`` are what the client's ``train_client`` is given."""
    first = ctxs[0]
    return train_local_vectorized(
        first.model,
        [ctx.data for ctx in ctxs],
        config,
        seeds=[ctx.seed for ctx in ctxs],
        spec=first.spec,
        device=first.device,
        round_num=first.round_num,
        step_budgets=[ctx.step_budget for ctx in ctxs],
        change=change,
        clients=[client(ctx) for ctx in ctxs] if client is not None else None,
    )


def client_delta(ctx: ClientContext, trained: Stacked, position: int) -> Params:
    """``global - local`` of the client at ``position`` of the stacks (``train_client``'s delta)."""
    return P.delta(ctx.global_params, {k: v[position] for k, v in trained.items()})


# Models that passed the check, with their trainable flags then: a worker trains one resident
# model chunk after chunk, and the check (a forward and backward under vmap) is not free.
_passed: weakref.WeakKeyDictionary[nn.Module, tuple[bool, ...]] = weakref.WeakKeyDictionary()


def _check_once(model: nn.Module, example: torch.Tensor | None) -> None:
    """``vectorization_blocker`` once per model and set of trainable parameters."""
    trainable = tuple(p.requires_grad for p in model.parameters())
    if _passed.get(model) == trainable:
        return
    if (blocker := vectorization_blocker(model, example)) is not None:
        raise ValueError(f"this model cannot train vectorized: {blocker}")
    _passed[model] = trainable


def train_local_vectorized(
    model: nn.Module,
    datas: Sequence[ClientData],
    config: LocalTrainConfig,
    *,
    seeds: Sequence[int],
    spec: DataSpec,
    device: torch.device | str = "cpu",
    round_num: int = 0,
    step_budgets: Sequence[int | None] | None = None,
    change: ClientChange = ClientChange(),
    clients: Sequence[PerClient] | None = None,
) -> tuple[Stacked, list[Metrics], Stacked]:
    """``train_local`` of ``model``'s current weights on each client's data, all at once.

    ``change`` is what every client's ``train_local`` is given, and ``clients`` (one per client,
    or None) what each is: ``edit``, ``passes`` and ``watch`` run for every client under
    ``vmap``, with each client's own ``own`` tensors, ``acc`` and ``draw``. Each batch takes one
    optimizer step per pass; the metrics count the first pass's task loss.

    Returns:
        Every client's trained ``params.model_params`` stacked (trainable parameters and float
        buffers, ``[clients, ...]``), each client's ``train_local`` metrics and the final
        accumulators of its ``watch``, stacked. ``model`` is left as it was (its weights are the
        starting point, never written).
    """
    if any(data.batch_transform is not None for data in datas):
        raise ValueError("a client's data has a batch_transform (augmentation): train it with train_local")
    tensors = [to_tensors(data, device) for data in datas]
    xs = [t["x"] for t in tensors if len(t["x"])]  # the probe's two rows (one twice), as the worker's
    example = xs[0][torch.arange(2, device=xs[0].device) % len(xs[0])] if xs else None
    _check_once(model, example)
    model.train()
    budgets = list(step_budgets) if step_budgets is not None else [None] * len(datas)
    epochs, merge = round_epochs(config, round_num), has_batchnorm(model)
    plans = [
        batch_plan(len(data), config.batch_size, epochs, step_limit(config, budget), seed, merge_lone=merge)
        for data, seed, budget in zip(datas, seeds, budgets, strict=True)
    ]
    chunk = _stack(model, len(datas), config)
    frozen = {k: p.detach() for k, p in model.named_parameters() if not p.requires_grad}
    dropout = HashedDropout(model)
    each = list(clients) if clients is not None else [PerClient()] * len(datas)
    own, acc = stack_own(each), stack_acc(each)
    passes = change.passes
    objectives = [_objective(model, frozen, spec, dropout, one_pass) for one_pass in passes]
    gradients = [vmap(grad(objective, has_aux=True), randomness="error") for objective in objectives]
    keys = torch.tensor(list(seeds), dtype=torch.int64, device=device)
    lr = round_lr(config, round_num)
    sums = torch.zeros(len(datas), 3, device=device)  # loss * count, #correct, #predictions
    for step, training, index, members, batch in dropout.over(
        _steps(plans, tensors, device, _trim(model, dropout))
    ):
        part = chunk.take(training)
        draws = torch.tensor([list(each[i].next_draws()) for i in members], device=device)  # (K, #draws)
        part_own = {k: v.index_select(0, index) for k, v in own.items()}
        for n, gradient in enumerate(gradients):
            dropout.step = optimizer_step = step * len(passes) + n  # each pass its own masks
            with lone_example(model, batch["x"].shape[1]):  # BatchNorm: running statistics
                grads, (loss, correct, count) = gradient(part.params, part.buffers, batch, keys[index], draws)
            grads = edit_stacked_gradients(change, part.params, grads, part_own)
            watch_stacked_(change, acc, grads, part_own, index, optimizer_step)
            if config.grad_clip is not None:
                _clip_(grads, config.grad_clip)
            _optimizer_step_(part, grads, config, lr, optimizer_step)
            if n == 0:
                counts = torch.stack([loss * count, correct.to(loss.dtype), count.to(loss.dtype)], 1)
                sums.index_add_(0, index, counts.to(sums.dtype))
        chunk.put(training, part)
    metrics = [_metrics(sums[i], plan, len(data)) for i, (plan, data) in enumerate(zip(plans, datas))]
    saved = P.model_params(model)
    return {k: (chunk.params | chunk.buffers)[k] for k in saved}, metrics, acc


def squared_gradient_sums(
    model: nn.Module,
    weights: Stacked,
    datas: Sequence[ClientData],
    batch_size: int,
    *,
    seeds: Sequence[int],
    spec: DataSpec,
    device: torch.device | str = "cpu",
) -> tuple[Stacked, list[int]]:
    """Per client, the sum over one pass of its batches (shuffled by its seed, as
    ``iterate_batches``) of the elementwise squared batch gradient at its ``weights`` (stacked
    ``params.model_params``, as ``train_local_vectorized`` returns them), in float32, with the
    number of batches: FedFish's Fisher pass. ``model``'s mode applies; no weight is changed."""
    params = {k: p for k, p in weights.items() if k in dict(model.named_parameters())}
    stacked = _stack(model, len(datas), LocalTrainConfig()).buffers
    buffers = {k: (weights[k] if k in weights else b).clone() for k, b in stacked.items()}  # the pass's own
    frozen = {k: p.detach() for k, p in model.named_parameters() if not p.requires_grad}
    dropout = HashedDropout(model)
    gradients = vmap(
        grad(_objective(model, frozen, spec, dropout, task_pass), has_aux=True), randomness="error"
    )
    keys = torch.tensor(list(seeds), dtype=torch.int64, device=device)
    merge = has_batchnorm(model)
    plans = [
        batch_plan(len(data), batch_size, 1, None, seed, merge_lone=merge)
        for data, seed in zip(datas, seeds, strict=True)
    ]
    sums = {k: torch.zeros_like(p, dtype=torch.float32) for k, p in params.items()}
    for _, clients, index, _, batch in dropout.over(
        _steps(plans, [to_tensors(d, device) for d in datas], device, _trim(model, dropout))
    ):
        take = (lambda t: t) if clients is None else (lambda t: t.index_select(0, clients))
        part = {k: take(b) for k, b in buffers.items()}
        no_draws = torch.zeros(len(index), 0, device=device)
        grads, _ = gradients({k: take(p) for k, p in params.items()}, part, batch, keys[index], no_draws)
        for k, g in grads.items():
            sums[k].index_add_(0, index, g.float() ** 2)
        if clients is not None:
            for k, b in buffers.items():
                b.index_copy_(0, clients, part[k])
    return sums, [len(plan) for plan in plans]


def _steps(
    plans: list[list[torch.Tensor]],
    tensors: list[Batch],
    device: torch.device | str,
    trim: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Iterator[tuple[int, torch.Tensor | None, torch.Tensor, list[int], Batch]]:
    """Each step's groups: the step, the clients (None: all of them), their positions (on the
    device, and as a list) and their stacked batch ``[clients, batch, ...]``. Clients with a batch
    at the step, grouped by its size (a short last batch trains apart, so BatchNorm never sees
    padding). ``trim`` (``_trim``) cuts the columns of a group's inputs.

    Every client's rows sit in one tensor per key, and every step's rows are indexed in it by one
    index tensor, moved to the device once: a step gathers its batch in one kernel per key, where
    one gather (and one host-to-device copy) per client made a GPU wait on the host."""
    everyone = torch.arange(len(plans), device=device)
    keys = list(tensors[0]) if tensors else []
    flat = {key: torch.cat([t[key] for t in tensors]) for key in keys}
    starts = [0, *itertools.accumulate(len(t[keys[0]]) for t in tensors[:-1])] if keys else []
    groups = [
        (step, members)
        for step in range(max((len(plan) for plan in plans), default=0))
        for members in _groups_by_size(plans, step)
    ]
    rows = [torch.cat([plans[i][step] + starts[i] for i in members]) for step, members in groups]
    on_device = torch.cat(rows).to(device).split([len(r) for r in rows]) if rows else []
    for (step, members), picked in zip(groups, on_device, strict=True):
        clients = None if len(members) == len(plans) else torch.tensor(members, device=device)
        batch = {
            key: rows_of.index_select(0, picked).view(len(members), -1, *rows_of.shape[1:])
            for key, rows_of in flat.items()
        }
        if trim is not None:
            batch["x"] = trim(batch["x"].flatten(0, 1)).unflatten(0, batch["x"].shape[:2])
        yield step, clients, everyone if clients is None else clients, members, batch


def _trim(model: nn.Module, dropout: HashedDropout) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A model's ``trimmed`` (a text classifier's trailing padding, which it cannot cut client by
    client under ``vmap``) for the group's inputs, unless it draws dropout: a hashed mask depends
    on the input's width, which would then depend on the other clients of the group."""
    return None if dropout.layers else getattr(model, "trimmed", None)


def _groups_by_size(plans: list[list[torch.Tensor]], step: int) -> list[list[int]]:
    """The clients with a batch at ``step``, grouped by its size (a short last batch trains apart)."""
    groups: dict[int, list[int]] = {}
    for i, plan in enumerate(plans):
        if step < len(plan):
            groups.setdefault(len(plan[step]), []).append(i)
    return list(groups.values())


def _stack(model: nn.Module, clients: int, config: LocalTrainConfig) -> _Chunk:
    """``clients`` copies of the model's trainable parameters and buffers, and zero moments."""
    copies = lambda t: t.detach().unsqueeze(0).repeat(clients, *([1] * t.dim()))  # noqa: E731
    params = {k: copies(p) for k, p in model.named_parameters() if p.requires_grad}
    buffers = {k: copies(b) for k, b in model.named_buffers()}
    names = ["exp_avg", "exp_avg_sq"] if config.optimizer == "adam" else ["momentum"] * (config.momentum > 0)
    return _Chunk(params, buffers, {m: {k: torch.zeros_like(p) for k, p in params.items()} for m in names})


def _objective(
    model: nn.Module, frozen: dict[str, torch.Tensor], spec: DataSpec, dropout: HashedDropout, one_pass: Pass
) -> Callable[[Stacked, Stacked, Batch, torch.Tensor, torch.Tensor], Losses]:
    """One client's ``one_pass`` at its weights; BatchNorm updates the buffers it is given in
    place, dropout draws from the client's ``key``."""

    def objective(
        params: Stacked, buffers: Stacked, batch: Batch, key: torch.Tensor, draws: torch.Tensor
    ) -> Losses:
        dropout.begin_forward(key)

        def task(
            weights: Stacked, weight_buffers: Stacked
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            outputs = functional_call(model, (weights, weight_buffers, frozen), (batch["x"],), strict=False)
            loss, correct, count = outputs_loss(outputs, batch, spec)
            return loss, torch.as_tensor(correct), torch.as_tensor(count, device=loss.device)

        total, (loss, correct, count) = one_pass(task, params, buffers, draws)
        return total, (loss.detach(), correct, count)

    return objective


def _clip_(grads: Stacked, max_norm: float) -> None:
    """``nn.utils.clip_grad_norm_`` per client: each client's global norm, each its own factor."""
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()], 1).norm(dim=1)
    factor = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads.values():
        g.mul_(factor.view(-1, *([1] * (g.dim() - 1))))


def _optimizer_step_(part: _Chunk, grads: Stacked, config: LocalTrainConfig, lr: float, step: int) -> None:
    """One ``torch.optim`` SGD or Adam step (single-tensor formulas) for every client of ``part``;
    every client here has taken ``step`` steps before, so the step counts are one number."""
    for k, p in part.params.items():
        g = grads[k]
        if config.weight_decay:
            g = g.add(p, alpha=config.weight_decay)
        if config.optimizer == "adam":
            beta1, beta2, eps, t = 0.9, 0.999, 1e-8, step + 1  # torch.optim.Adam's defaults
            m, v = part.moments["exp_avg"][k], part.moments["exp_avg_sq"][k]
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / (1 - beta2**t) ** 0.5).add_(eps)
            p.addcdiv_(m, denom, value=-lr / (1 - beta1**t))
            continue
        if config.momentum:
            buf = part.moments["momentum"][k]
            if step == 0:
                buf.copy_(g)  # torch.optim.SGD's first step: the buffer is the gradient
            else:
                buf.mul_(config.momentum).add_(g)
            g = buf
        p.add_(g, alpha=-lr)


def _metrics(sums: torch.Tensor, plan: list[torch.Tensor], num_examples: int) -> Metrics:
    """``train_local``'s metrics from the client's sums and its batches."""
    loss_sum, correct, seen = (float(v) for v in sums)
    denominator = max(seen, 1.0)
    return {
        "train/loss": loss_sum / denominator,
        "train/accuracy": correct / denominator,
        "train/steps": float(len(plan)),
        "train/num_examples": float(min(sum(len(b) for b in plan), num_examples)),
    }
