"""The shared local trainer that every plugin builds on (evaluation is ``raysim.measure.evaluate``).

Plugins vary local training through hooks rather than subclassing. A ``change``
(``raysim.train.client_change.ClientChange``), written over tensors by name, serves the vectorized
trainer too: a gradient ``edit`` (FedProx, SCAFFOLD, FedDyn), each batch's ``passes`` (FedGuCci's
step per anchor) and a ``watch`` of every backward's gradients (FedFish's last-epoch Fisher), with
each client's ``PerClient`` values. Model hooks serve one client at a time: ``loss_fn`` replaces
the task loss (logit calibration) and ``extra_loss`` adds a term (MOON's). All of them travel as
one ``LocalHooks`` from ``train_client`` and ``train_context`` down to ``train_local``.
``step`` says how each pass takes its optimizer step: one backward and one step (``gradient_step``,
the default) or two backwards (SAM, ``raysim.train.sharpness.sam_step``). Batching, the lr,
``max_steps`` and the metrics stay in ``train_local`` whatever the step.

A client that can do only part of its local work this round (a straggler, ``raysim.systems``)
has a ``step_budget`` on its context, which caps its batches whatever config the plugin passes.
A job's ``privacy.sample`` reaches the loop the same way (``ClientContext.sample_privacy``): DP-SGD's
Poisson batches and clipped, noised gradients (``raysim.train.dp_sgd``) replace plain ones.

Usage:
    metrics = train_local(model, data, LocalTrainConfig(lr=0.1), seed=7, spec=spec)
    delta, metrics = train_client(ctx, config)          # the FedAvg client's local work
    metrics = train_context(replace(ctx, data=train), config)   # no delta: a part of its data
    delta, metrics = train_client(ctx, config, LocalHooks(extra_loss=term, step=sam_step(0.05)))
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
from pydantic import BaseModel, Field, model_validator
from torch import nn

from raysim import params as P
from raysim.config.sections import OnOffAuto
from raysim.sampling import noise_seed
from raysim.train.batching import Batch, has_batchnorm, iterate_batches, to_tensors, with_lone_examples
from raysim.train.client_change import (
    BatchLoss,
    ClientChange,
    Draws,
    ModelWatch,
    Pass,
    PerClient,
    Weights,
    edit_model_gradients,
    model_pass,
)
from raysim.train.conv_layout import channels_last, wants_channels_last
from raysim.train.dp_sgd import DpSgd, SampleNoise
from raysim.train.schedules import EpochDecay, Exponential, Schedule
from raysim.train.task_loss import task_loss, train_metrics
from raysim.types import ClientContext, ClientData, ClientMetrics, DataSpec, Params

ExtraLoss = Callable[[nn.Module, Batch], torch.Tensor]
LossFn = Callable[[nn.Module, Batch, DataSpec], BatchLoss]


class Backward(Protocol):
    """Leaves the gradient of the local objective on ``batch``, at the current weights, in ``.grad``.

    Zeroes the gradients, computes the pass's objective (over ``loss_fn``, the trainer's task loss
    when None) plus ``extra_loss``, back-propagates, then applies the change's ``edit`` and
    ``watch`` and ``grad_clip``. Returns the task loss, for the metrics.
    """

    def __call__(self, batch: Batch, loss_fn: LossFn | None = None) -> BatchLoss: ...


class LocalStep(Protocol):
    """What one pass of a batch does in ``train_local``: the gradients it takes and the optimizer step.

    It replaces "zero_grad, forward, loss, backward, step": it calls ``backward`` once or more
    and ``optimizer.step()``, and returns the loss its metrics should count (the first
    backward's, at the weights the pass started from). ``max_steps`` counts batches.
    """

    def __call__(
        self, model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, backward: Backward
    ) -> BatchLoss: ...


def gradient_step(
    model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, backward: Backward
) -> BatchLoss:
    """The default step: one backward pass, one optimizer step."""
    loss = backward(batch)
    optimizer.step()
    return loss


class LocalTrainConfig(BaseModel, frozen=True, extra="forbid"):
    """Client-side training hyper-parameters."""

    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)  # BatchNorm: an epoch's last batch of one joins the one before
    lr: float = Field(0.05, gt=0, allow_inf_nan=False)  # inf passes gt=0: every client NaN
    lr_decay: float = Field(1.0, gt=0, le=1)  # round r trains at lr * lr_decay**r
    lr_schedule: Schedule | None = None  # any raysim.train.schedules lr schedule, instead of lr_decay
    epochs_schedule: EpochDecay | None = None  # round r trains round_epochs(config, r) epochs
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)
    optimizer: str = Field("sgd", pattern="^(sgd|adam)$")
    max_steps: int | None = Field(None, ge=1)  # stop after this many batches (local steps)
    grad_clip: float | None = Field(None, gt=0, allow_inf_nan=False)  # max global grad norm
    channels_last: OnOffAuto = "auto"  # convolutions in channels-last memory; auto: on the CPU

    @model_validator(mode="after")
    def _one_lr_schedule(self) -> "LocalTrainConfig":
        if self.lr_schedule is not None and self.lr_decay != 1.0:
            raise ValueError(
                "set lr_decay or lr_schedule, not both (lr_decay: d is lr_schedule: "
                "{kind: exponential, decay: d})"
            )
        return self


def step_limit(config: LocalTrainConfig, step_budget: int | None) -> int | None:
    """The most batches ``train_local`` takes: ``max_steps``, within the client's ``step_budget``
    (FedProx's variable local work, Li et al., MLSys 2020, arXiv:1812.06127; ``raysim.systems``)."""
    if step_budget is None or config.max_steps is None:
        return config.max_steps if step_budget is None else step_budget
    return min(step_budget, config.max_steps)


def lr_schedule(config: LocalTrainConfig) -> Schedule:
    """The client lr schedule: ``lr_schedule``, else ``lr_decay`` per round (``exponential``)."""
    return config.lr_schedule if config.lr_schedule is not None else Exponential(decay=config.lr_decay)


def round_lr(config: LocalTrainConfig, round_num: int) -> float:
    """The local learning rate in ``round_num``: ``lr`` scaled by the schedule."""
    return lr_schedule(config).value(config.lr, round_num)


def round_epochs(config: LocalTrainConfig, round_num: int) -> int:
    """The local epochs in ``round_num``: ``epochs``, or what ``epochs_schedule`` makes of them."""
    schedule = config.epochs_schedule
    return config.epochs if schedule is None else schedule.epochs(config.epochs, round_num)


def make_optimizer(model: nn.Module, config: LocalTrainConfig, lr: float) -> torch.optim.Optimizer:
    trainable = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "adam":
        return torch.optim.Adam(trainable, lr=lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(trainable, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay)


@dataclass(frozen=True)
class LocalHooks:
    """A plugin's hooks into local training, passed whole from ``train_client`` down to the loop.

    Attributes:
        change: its change, as the vectorized trainer runs it too: ``edit`` and ``watch`` after
            every backward pass, one ``step`` per pass of ``passes``.
        client: the client's values for ``change``: ``own``, ``acc``, ``draw`` once per batch.
        loss_fn: replaces ``task_loss``.
        extra_loss: a term added to the loss before every backward pass.
        step: what each pass of a batch does (``gradient_step`` when None).
    """

    change: ClientChange = ClientChange()
    client: PerClient = PerClient()
    loss_fn: LossFn | None = None
    extra_loss: ExtraLoss | None = None
    step: LocalStep | None = None


def train_local(
    model: nn.Module,
    data: ClientData,
    config: LocalTrainConfig,
    *,
    seed: int,
    spec: DataSpec,
    device: torch.device | str = "cpu",
    round_num: int = 0,
    step_budget: int | None = None,
    hooks: LocalHooks = LocalHooks(),
    sample_privacy: SampleNoise | None = None,
) -> ClientMetrics:
    """``train_local_watched``'s metrics: ``model`` trained in place on one client's data."""
    return train_local_watched(
        model,
        data,
        config,
        seed=seed,
        spec=spec,
        device=device,
        round_num=round_num,
        step_budget=step_budget,
        hooks=hooks,
        sample_privacy=sample_privacy,
    )[0]


def train_local_watched(
    model: nn.Module,
    data: ClientData,
    config: LocalTrainConfig,
    *,
    seed: int,
    spec: DataSpec,
    device: torch.device | str = "cpu",
    round_num: int = 0,
    step_budget: int | None = None,
    hooks: LocalHooks = LocalHooks(),
    sample_privacy: SampleNoise | None = None,
) -> tuple[ClientMetrics, Weights]:
    """Trains ``model`` in place on one client's data; returns train metrics and the final
    accumulator of the change's ``watch`` (the client's ``acc`` when it has none).

    Shuffling is drawn from ``seed`` alone, so a client's training does not depend on which
    worker runs it or what ran before.

    Args:
        model: the resident model, trained in place.
        data: the client's examples this round.
        config: epochs, batch size, optimizer, lr, ``max_steps`` (batches) and clipping.
        seed: seeds the shuffling.
        spec: what the task loss needs to know about the data.
        device: where the data goes (the model is already there).
        round_num: selects the lr (``round_lr``) and the epochs (``round_epochs``).
        step_budget: caps the batches too (``ClientContext.step_budget``; None: no cap).
        hooks: the plugin's (``LocalHooks``).
        sample_privacy: DP-SGD's clip bound, noise and the noise's seed (``raysim.train.dp_sgd``):
            Poisson batches, each example's gradient clipped, noise on their sum; None: plain SGD.

    Returns:
        ``train/loss`` and ``train/accuracy`` (means over the predictions of the first pass of
        each batch), ``train/steps`` (batches) and ``train/num_examples``: the distinct examples
        trained on. Each epoch visits every example once, so that is all of them after a full
        first epoch however many epochs follow (FedAvg's n_k), and fewer only when
        ``max_steps`` stops the first epoch early. Under DP-SGD, its counts too (``DpSgd.metrics``).
    """
    model.train()
    # the convolutions channels-last for the client's steps; DP-SGD's per-example passes as built
    fast_convs = sample_privacy is None and wants_channels_last(config.channels_last, model, device)
    with channels_last(model) if fast_convs else nullcontext():
        return _train_steps(
            model, data, config, seed, spec, device, round_num, step_budget, hooks, sample_privacy
        )


def _train_steps(
    model: nn.Module,
    data: ClientData,
    config: LocalTrainConfig,
    seed: int,
    spec: DataSpec,
    device: torch.device | str,
    round_num: int,
    step_budget: int | None,
    hooks: LocalHooks,
    sample_privacy: SampleNoise | None,
) -> tuple[ClientMetrics, Weights]:
    """``train_local_watched``'s optimizer, batches and steps."""
    optimizer = make_optimizer(model, config, round_lr(config, round_num))
    tensors = to_tensors(data, device)
    generator = torch.Generator().manual_seed(seed)
    watch = ModelWatch(hooks.change, hooks.client)
    private = None if sample_privacy is None else DpSgd.of(sample_privacy, model, spec, config)
    backward = _objective_backward(model, optimizer, spec, config, hooks, watch, private)
    take_step = with_lone_examples(hooks.step or gradient_step)  # BatchNorm and one example
    num_epochs = round_epochs(config, round_num)
    draw = partial(iterate_batches, merge_lone=has_batchnorm(model)) if private is None else private.batches
    epochs = (draw(tensors, config.batch_size, generator) for _ in range(num_epochs))
    # the sums stay on the device until the end (one sync per client, not one per batch)
    loss_sum: torch.Tensor | float = 0.0
    correct: torch.Tensor | int = 0
    seen: torch.Tensor | int = 0
    num_batches, num_used = 0, 0
    batches = itertools.islice(itertools.chain.from_iterable(epochs), step_limit(config, step_budget))
    for step_num, batch in enumerate(batches):
        if data.batch_transform is not None:  # augmentation, poisoning: drawn per (client, round, batch)
            batch = data.batch_transform(batch, step_num)
        draws = hooks.client.next_draws()
        losses = [take_step(model, batch, optimizer, backward(p, draws)) for p in hooks.change.passes]
        loss, num_correct, num_items = losses[0]
        loss_sum = loss_sum + loss.detach() * num_items
        correct, seen = correct + num_correct, seen + num_items
        size = len(next(iter(batch.values()))) if private is None else config.batch_size  # Poisson: expected
        num_batches, num_used = num_batches + 1, num_used + size
    metrics = train_metrics(loss_sum, correct, seen, num_batches, min(num_used, len(data)))
    return metrics | (private.metrics() if private is not None else {}), watch.acc


def _objective_backward(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    spec: DataSpec,
    config: LocalTrainConfig,
    hooks: LocalHooks,
    watch: ModelWatch,
    private: DpSgd | None = None,
) -> Callable[[Pass, Draws], Backward]:
    """The ``Backward`` of one pass of one client's training, given the batch's draws: its loss
    (DP-SGD's private gradient with ``private``), its hooks and gradient clipping."""

    def backward_of(one_pass: Pass, draws: Draws) -> Backward:
        def backward(batch: Batch, loss_fn: LossFn | None = None) -> BatchLoss:
            def model_loss(module: nn.Module) -> BatchLoss:
                return (loss_fn or hooks.loss_fn or task_loss)(module, batch, spec)

            if private is not None:  # writes each .grad itself; refuses a loss of its own
                loss, num_correct, num_items = private.backward(
                    model, batch, one_pass, loss_fn or hooks.loss_fn, hooks.extra_loss
                )
            else:
                total, (loss, num_correct, num_items) = model_pass(one_pass, model, model_loss, draws)
                if hooks.extra_loss is not None:
                    total = total + hooks.extra_loss(model, batch)
                optimizer.zero_grad(set_to_none=True)
                total.backward()
            edit_model_gradients(hooks.change, hooks.client, model)
            watch(model)
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            return loss, num_correct, num_items

        return backward

    return backward_of


def examples_trained_on(metrics: Mapping[str, float | torch.Tensor]) -> float:
    """The FedAvg family's client weight: the distinct examples this round's local steps visited.

    After a full first epoch that is all of the client's examples this round, FedAvg's n_k. When
    ``max_steps`` or a straggler's ``step_budget`` ends the first epoch early it is fewer: the client
    counts by the examples whose gradients are in its delta (docs/baselines.md, "Client weights
    under partial work"). FedNova weights by data size instead, as its ``a_i`` counts the steps.
    ``metrics`` are ``train_local``'s for the client."""
    return float(metrics["train/num_examples"])  # a count the host knows: no device read


def train_context(
    ctx: ClientContext, config: LocalTrainConfig, hooks: LocalHooks = LocalHooks()
) -> ClientMetrics:
    """``train_local`` of ``ctx.model`` on ``ctx.data`` with the seed, device, round and step budget
    of ``ctx``; returns the metrics. A plugin training something else states it on the context:
    ``replace(ctx, data=train)`` (a part of its data), ``replace(ctx, model=net)``, ``replace(ctx,
    seed=s, step_budget=left)``."""
    return _train_context(ctx, config, hooks)[0]


def train_client(
    ctx: ClientContext, config: LocalTrainConfig, hooks: LocalHooks = LocalHooks()
) -> tuple[Params, ClientMetrics]:
    """One client's local work, ``train_context``; returns ``delta = global - local`` and the metrics.

    The FedAvg client sends that delta weighted by ``examples_trained_on(metrics)``: the client's
    examples this round, or fewer when ``max_steps`` or the step budget ends the first epoch early.
    """
    metrics = train_context(ctx, config, hooks)
    return P.delta(ctx.global_params, P.model_params(ctx.model)), metrics


def train_client_watched(
    ctx: ClientContext, config: LocalTrainConfig, hooks: LocalHooks
) -> tuple[Params, ClientMetrics, Weights]:
    """``train_client``, and its change's ``watch``'s final accumulator (FedFish's Fisher)."""
    metrics, acc = _train_context(ctx, config, hooks)
    return P.delta(ctx.global_params, P.model_params(ctx.model)), metrics, acc


def _train_context(
    ctx: ClientContext, config: LocalTrainConfig, hooks: LocalHooks
) -> tuple[ClientMetrics, Weights]:
    """``train_local_watched`` where ``ctx`` says: its model, data, seed, device, round, budget and
    sample-level privacy, its noise seeded by the client's seed, round and id."""
    private = ctx.sample_privacy
    seed = noise_seed(ctx.seed, ctx.round_num, ctx.client_id, ctx.noise_salt)
    return train_local_watched(
        ctx.model,
        ctx.data,
        config,
        seed=ctx.seed,
        spec=ctx.spec,
        device=ctx.device,
        round_num=ctx.round_num,
        step_budget=ctx.step_budget,
        hooks=hooks,
        sample_privacy=None if private is None else SampleNoise(private, seed),
    )
