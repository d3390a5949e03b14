"""FedFish: Fisher-weighted function-space aggregation (Dhawan et al. 2023, arXiv:2311.10291).

FedAvg with another aggregation rule. Each client trains E epochs of local SGD, then makes one
extra pass at its final weights summing the elementwise squares of its mini-batch gradients (the
diagonal empirical Fisher F_i). The server's pseudo-gradient is, per coordinate,

    pg = sum_i w_i F_i delta_i / sum_i w_i F_i        (w_i = examples used this round)

falling back to FedAvg's ``sum_i w_i delta_i / sum_i w_i`` where every F_i is zero (tokens no
client saw, float buffers). With equal Fishers this is exactly FedAvg. The server then steps with
its optimizer (Adam in the paper: betas (0.9, 0.999), eps 1e-7, bias correction).
Ablation (``fisher_source: last_epoch``): square the training gradients of the last epoch instead
of making the extra pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
from pydantic import BaseModel, model_validator

from raysim import params as P
from raysim.registry import register
from raysim.train.batching import has_batchnorm, iterate_batches, lone_example, to_tensors
from raysim.train.client_change import ClientChange, PerClient, Weights
from raysim.train.local import (
    LocalHooks,
    LocalTrainConfig,
    examples_trained_on,
    round_epochs,
    train_client_watched,
)
from raysim.train.server_opt import ServerOptimizerConfig, apply_server_step, init_state, params_payload
from raysim.train.task_loss import task_loss
from raysim.train.vectorized import client_delta, squared_gradient_sums, train_contexts
from raysim.types import (
    ClientContext,
    ClientData,
    ClientResult,
    DataSpec,
    Metrics,
    Params,
    Payload,
    RunInfo,
    ServerState,
)


class FedFishConfig(BaseModel, frozen=True, extra="forbid"):
    """FedFish: clients send delta and a diagonal Fisher; the server takes the Fisher-weighted mean."""

    local: LocalTrainConfig = LocalTrainConfig(lr=1e-3)
    server: ServerOptimizerConfig = ServerOptimizerConfig(
        kind="adam", lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-7, bias_correction=True
    )
    fisher_source: Literal["extra_pass", "last_epoch"] = "extra_pass"
    fisher_reduce: Literal["sum", "mean"] = "sum"  # Algorithm 2 sums over batches
    fisher_mode: Literal["train", "eval"] = "train"  # model mode during the extra pass
    # float64 sums make equal Fishers give FedAvg bit for bit; float32 halves the three model-sized
    # accumulators (a 1.5B model: 18 GB instead of 37 GB per worker). The weights are convex.
    accumulate: Literal["float64", "float32"] = "float64"

    def sample_privacy_problem(self) -> str | None:
        """Why DP-SGD cannot hold here (``raysim.config.plugins.sample_privacy_problem``)."""
        if self.fisher_source == "last_epoch":  # the Fisher of the private gradients
            return None
        return (
            "its Fisher (fisher_source: extra_pass) squares plain gradients of the examples and is uploaded "
            "without noise; set fisher_source: last_epoch, which squares the private ones"
        )

    @model_validator(mode="after")
    def _whole_last_epoch(self) -> "FedFishConfig":
        if self.fisher_source == "last_epoch" and self.local.max_steps is not None:
            raise ValueError("fisher_source last_epoch needs whole epochs: unset local.max_steps")
        return self


@dataclass(frozen=True)
class FisherUpdate:
    """What a client sends: its delta and its diagonal Fisher (trainable parameters only)."""

    delta: Params
    fisher: Params


@dataclass(frozen=True)
class FisherAggregate:
    """The cohort's Fisher-weighted mean delta, with what the server logs about it."""

    pseudo_grad: Params
    zero_fisher_fraction: float  # of the parameters' coordinates no client has a Fisher for
    fedavg_norm: float  # what FedAvg would have stepped on: ||sum_i w_i delta_i|| / sum_i w_i


@dataclass(frozen=True)
class _FisherSums:
    num: Params | None  # sum_i w_i F_i delta_i (float64)
    den: Params | None  # sum_i w_i F_i
    avg: Params | None  # sum_i w_i delta_i, the fallback where den == 0
    weight: float
    fisher_keys: frozenset[str] = frozenset()  # parameters; the other keys are float buffers


class FisherWeightedMean:
    """Associative fold of ``FisherUpdate``s into the FedFish pseudo-gradient.

    The products ``w F delta`` are formed in float64 on the worker (by default), so equal Fishers
    give FedAvg's ``WeightedMean`` bit for bit.
    """

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        self.dtype = dtype

    def zero(self) -> _FisherSums:
        return _FisherSums(None, None, None, 0.0)

    def add(self, acc: _FisherSums, position: int, result: ClientResult[FisherUpdate, None]) -> _FisherSums:
        w = float(result.weight)

        def copy(t: torch.Tensor) -> torch.Tensor:  # a copy of its own: folded in place below
            return t.detach().to(self.dtype, copy=True)

        delta = {k: copy(v) for k, v in result.update.delta.items()}
        given = result.update.fisher
        fisher = {k: copy(given[k]) if k in given else torch.zeros_like(d) for k, d in delta.items()}
        num = {k: (fisher[k] * delta[k]).mul_(w) for k in delta}
        den = {k: fisher[k].mul_(w) for k in delta}
        avg = {k: d.mul_(w) for k, d in delta.items()}
        return self.merge(acc, _FisherSums(num, den, avg, w, frozenset(given)))

    def merge(self, left: _FisherSums, right: _FisherSums) -> _FisherSums:
        if left.num is None:
            return right
        if right.num is None:
            return left

        def add(a: Params | None, b: Params | None) -> Params | None:
            if a is None or b is None:  # never: den and avg are set together with num
                return a if b is None else b
            return {k: a[k].add_(b[k].to(a[k].device)) for k in a}

        return _FisherSums(
            add(left.num, right.num),
            add(left.den, right.den),
            add(left.avg, right.avg),
            left.weight + right.weight,
            left.fisher_keys | right.fisher_keys,
        )

    def with_total_weight(self, acc: _FisherSums, weight: float) -> _FisherSums:
        """``acc`` with FedAvg's fallback divided by ``weight``: central DP's fixed denominator (the
        Fisher-weighted mean is a ratio of two noised sums and needs none)."""
        return replace(acc, weight=weight)

    def result(self, acc: _FisherSums) -> FisherAggregate | None:
        if acc.num is None or acc.weight == 0:
            return None
        assert acc.den is not None and acc.avg is not None  # set together with num
        pseudo_grad, num_zero, total = {}, 0, 0
        for k, num in acc.num.items():
            den, fedavg = acc.den[k], acc.avg[k] / acc.weight
            has_fisher = den > 0
            fisher_mean = num / torch.where(has_fisher, den, torch.ones_like(den))
            pseudo_grad[k] = torch.where(has_fisher, fisher_mean, fedavg).float()
            if k in acc.fisher_keys:  # buffers have no Fisher by design: not counted
                num_zero, total = num_zero + int((~has_fisher).sum()), total + den.numel()
        buffers = acc.avg.keys() - acc.fisher_keys
        return FisherAggregate(
            pseudo_grad,
            zero_fisher_fraction=num_zero / max(total, 1),
            fedavg_norm=P.global_norm(acc.avg, skip=buffers) / acc.weight,  # parameters only
        )


def fisher_pass(
    model: torch.nn.Module,
    data: ClientData,
    batch_size: int,
    spec: DataSpec,
    device: torch.device,
    seed: int,
    reduce: str = "sum",
) -> Params:
    """Sum (or mean) over mini-batches of the elementwise squared batch gradient, at ``model``."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    fisher = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}
    num_batches = 0
    generator = torch.Generator().manual_seed(seed)
    merge = has_batchnorm(model)  # as train_local batches (raysim.train.batching)
    for batch in iterate_batches(to_tensors(data, device), batch_size, generator, merge_lone=merge):
        model.zero_grad(set_to_none=True)
        with lone_example(model, len(batch["x"])):
            task_loss(model, batch, spec)[0].backward()
        for name, p in params.items():
            if p.grad is not None:  # accumulate in fp32: squares of small gradients underflow
                grad = p.grad.detach().float()
                fisher[name].addcmul_(grad, grad)
        num_batches += 1
    model.zero_grad(set_to_none=True)
    if reduce == "mean" and num_batches:
        fisher = {k: v / num_batches for k, v in fisher.items()}
    return fisher


BATCHES = "#batches"  # the accumulator's batch count: "#" is in no parameter's name
FIRST_STEP = "#first_step"


def last_epoch_start(
    num_examples: int, config: LocalTrainConfig, round_num: int, step_budget: int | None
) -> int:
    """The first step of the last epoch the client trains: under a straggler's step budget the
    last one it starts, possibly cut short (a budget ending earlier would leave the Fisher all
    zeros and the client silently out of the aggregate)."""
    per_epoch = math.ceil(num_examples / config.batch_size)
    steps = round_epochs(config, round_num) * per_epoch  # an epochs_schedule may change them by round
    if step_budget is not None:
        steps = min(steps, step_budget)
    return max(steps - 1, 0) // max(per_epoch, 1) * per_epoch


def last_epoch_fisher(grads: Weights, acc: Weights, own: Weights, step: int) -> Weights:
    """A ``watch`` summing the squared gradients of the steps from ``own[FIRST_STEP]`` on (the
    ablation), in float32, and counting them; a selection, not a branch, so ``vmap`` runs it."""
    in_last = step >= own[FIRST_STEP]
    summed = {
        k: torch.where(in_last, a + grads[k].float() ** 2, a) if k in grads else a
        for k, a in acc.items()
        if k != BATCHES
    }
    return summed | {BATCHES: acc[BATCHES] + in_last.long()}


LAST_EPOCH_FISHER = ClientChange(watch=last_epoch_fisher)


def last_epoch_start_of(ctx: ClientContext[None, None], config: LocalTrainConfig) -> PerClient:
    """The client's values for ``LAST_EPOCH_FISHER``: zero sums over its trainable parameters,
    and the step its last epoch starts at as its own."""
    first = last_epoch_start(len(ctx.data), config, ctx.round_num, ctx.step_budget)
    trainable = [(name, p) for name, p in ctx.model.named_parameters() if p.requires_grad]
    zeros = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in trainable}
    count = torch.zeros((), dtype=torch.long, device=ctx.device)
    own = {FIRST_STEP: torch.tensor(first, device=ctx.device)}
    return PerClient(own=own, acc=zeros | {BATCHES: count})


@register("algorithm", "fedfish")
class FedFish:
    """FedFish: FedAvg whose server takes the Fisher-weighted mean of the client deltas."""

    Config = FedFishConfig
    UPDATE_DELTA = "delta"  # compression encodes the delta; the Fisher travels whole

    def __init__(self, config: FedFishConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        return init_state(params, info, None)

    def payload(self, state: ServerState[None], round_num: int, info: RunInfo) -> Payload[None]:
        return params_payload(state)

    def change(self) -> ClientChange:
        """The last-epoch Fisher's watch (the ablation), else no change."""
        return LAST_EPOCH_FISHER if self.config.fisher_source == "last_epoch" else ClientChange()

    def per_client(self, ctx: ClientContext[None, None]) -> PerClient:
        """The client's values for ``change``: where its last epoch starts, its zero sums."""
        if self.config.fisher_source == "last_epoch":
            return last_epoch_start_of(ctx, self.config.local)
        return PerClient()

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[FisherUpdate, None]:
        c = self.config
        data, local = ctx.data, c.local  # the round's D_i (engine.max_client_examples caps it)
        delta, metrics, watched = train_client_watched(
            ctx, local, LocalHooks(change=self.change(), client=self.per_client(ctx))
        )
        if c.fisher_source == "extra_pass":
            buffers = {k: v.clone() for k, v in ctx.model.named_buffers()}  # BatchNorm statistics
            ctx.model.train(c.fisher_mode == "train")
            fisher = fisher_pass(
                ctx.model,
                data,
                local.batch_size,
                ctx.spec,
                ctx.device,
                seed=ctx.seed + 1,
                reduce=c.fisher_reduce,
            )
            with torch.no_grad():  # the pass must not move them: the local model is theta_i
                for name, value in ctx.model.named_buffers():
                    value.copy_(buffers[name])
        else:
            batches = int(watched[BATCHES])
            scale = 1 / batches if c.fisher_reduce == "mean" and batches else 1.0
            fisher = {k: v * scale for k, v in watched.items() if k != BATCHES}
        weight = examples_trained_on(metrics)  # fewer than len(ctx.data) if max_steps cut in
        return ClientResult(FisherUpdate(delta, fisher), weight, metrics)

    def vectorized_update(
        self, ctxs: list[ClientContext[None, None]]
    ) -> list[ClientResult[FisherUpdate, None]]:
        c, first = self.config, ctxs[0]
        trained, metrics, watched = train_contexts(
            ctxs, c.local, change=self.change(), client=self.per_client
        )
        if c.fisher_source == "last_epoch":
            sums = {k: v for k, v in watched.items() if k != BATCHES}
            batches = watched[BATCHES].tolist()
        else:
            first.model.train(c.fisher_mode == "train")  # the pass's mode; the worker resets it
            datas, seeds = [ctx.data for ctx in ctxs], [ctx.seed + 1 for ctx in ctxs]
            sums, batches = squared_gradient_sums(
                first.model,
                trained,
                datas,
                c.local.batch_size,
                seeds=seeds,
                spec=first.spec,
                device=first.device,
            )
        results: list[ClientResult[FisherUpdate, None]] = []
        for i, ctx in enumerate(ctxs):
            scale = 1 / batches[i] if c.fisher_reduce == "mean" and batches[i] else 1.0
            fisher = {k: v[i] * scale for k, v in sums.items()}
            update = FisherUpdate(client_delta(ctx, trained, i), fisher)
            results.append(ClientResult(update, examples_trained_on(metrics[i]), metrics[i]))
        return results

    def aggregator(self) -> FisherWeightedMean:
        return FisherWeightedMean(getattr(torch, self.config.accumulate))

    def pseudo_gradient(self, aggregate: FisherAggregate) -> Params:
        return aggregate.pseudo_grad

    def server_update(
        self, state: ServerState[None], aggregate: FisherAggregate | None, round_num: int, info: RunInfo
    ) -> tuple[ServerState[None], Metrics]:
        if aggregate is None:
            return state, {}
        state, metrics = apply_server_step(state, self.pseudo_gradient(aggregate), self.config.server)
        # parameters only: on buffers both methods average, which would pull the ratio towards 1
        norm, fedavg_norm = metrics["server/delta_norm"], aggregate.fedavg_norm
        return state, metrics | {
            "fedfish/zero_fisher_fraction": aggregate.zero_fisher_fraction,
            # > 1: the Fisher weights pick out single clients' deltas instead of averaging them
            "fedfish/norm_ratio_to_fedavg": norm / fedavg_norm if fedavg_norm > 0 else 1.0,
        }
