"""Evaluation of the global model: on a central test set, on clients' test splits (and their
validation rows, ``dataset.validation_fraction``: ``eval/validation/...``), on held-out clients,
with few-shot personalization and on transfer datasets; all spread over the workers. A poisoned
job (``dataset.poison``) adds the backdoor accuracy on the triggered central test set, a
label-flipping attack (``attack: {kind: label_flip}``) its success on the flipped one. A plugin
whose clients keep a personal part (``personal_model``: FedRoD's head, FedBN's BatchNorm layers)
has each evaluated training client's own predictor measured too (``eval/personal/...``). A store
partitioned by domain adds each domain's accuracy (``eval/domain/...``, ``raysim.engine.domain_scores``).

Per-client results are summarised as the example-weighted mean (``eval/clients/accuracy``), the
unweighted mean over clients and the distribution over clients (std, 10th/50th/90th percentile).
Scores that are not means over examples (MCC, F1, Pearson: ``raysim.measure.scores``) are pooled instead:
``eval/clients/mcc`` is the MCC of all the evaluated clients' examples together, computed from the
clients' summed statistics, and ``eval/clients/mcc_mean`` the mean of the per-client values; a
causal LM's ``eval/clients/perplexity`` is that of the pooled loss (``raysim.measure.pooling``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from raysim import params as P
from raysim.config import PersonalizationConfig, TimeToTargetConfig
from raysim.engine.domain_scores import summarize_domains
from raysim.engine.predictor import Predictor
from raysim.errors import ConfigError, NonFiniteError
from raysim.measure.pooling import scored, summarize_clients
from raysim.runtime.backend import Backend
from raysim.types import Metrics, NumpyParams, Params


@dataclass(frozen=True)
class EvaluationPlan:
    """Which clients each evaluation looks at; fixed for the whole run."""

    clients: np.ndarray  # training clients whose test splits are evaluated
    heldout: np.ndarray  # clients that never train (empty: none held out)
    transfer: dict[str, np.ndarray] = field(default_factory=dict)  # transfer dataset -> clients
    personalization: PersonalizationConfig | None = None
    personalize_transfer: frozenset[str] = frozenset()
    num_skipped: dict[str, int] = field(default_factory=dict)  # scope -> clients left out
    backdoor: bool = False  # dataset.poison: the attack success rate on the triggered test set
    flip_success: bool = False  # attack label_flip: the share of flipped test labels predicted
    validation: bool = False  # dataset.validation_fraction: the clients' validation rows too
    with_client_state: bool = False  # the plugin has personal_model: clients' own predictors too
    domain_of: dict[int, str] = field(default_factory=dict)  # evaluated client -> domain: eval/domain/*


def keep_personalizable(plan: EvaluationPlan, num_train: np.ndarray, num_test: np.ndarray) -> EvaluationPlan:
    """The plan with the personalized clients narrowed to those personalization admits.

    Personalization skips clients below ``min_examples`` (FedFish filters C4 at 4); the plain
    evaluations of the same scope on other rounds must skip them too, or ``eval/heldout/*``
    would average two sets of clients. ``num_train``/``num_test``: examples per client id.
    """
    config = plan.personalization
    if config is None:
        return plan
    name, scope = ("heldout", "eval/heldout") if len(plan.heldout) else ("clients", "eval/clients")
    clients = getattr(plan, name)
    admitted = config.admits(num_train[clients], num_test[clients])
    return replace(plan, **{name: clients[admitted]}, num_skipped={scope: int((~admitted).sum())})


def evaluate_global(
    backend: Backend,
    params: Params,
    plan: EvaluationPlan,
    personalize_round: int | None = None,
    state_round: int | None = None,
) -> Metrics:
    """Central, per-client, held-out, personalized and transfer evaluation, as ``eval/...``.

    Personalization and transfer run only with a ``personalize_round`` (they fine-tune per client,
    seeded by that round). A plan ``with_client_state`` adds, given the ``state_round`` whose
    client state (and earlier) applies, each evaluated client's own predictor (``eval/personal``).
    """
    t0 = time.perf_counter()
    weights = P.to_numpy(params)
    # the held-out clients are personalized instead, where that is due
    metrics = evaluate_predictor(backend, Predictor.of([weights]), plan, heldout=personalize_round is None)
    refuse_nonfinite_losses(metrics, state_round)
    if plan.with_client_state and state_round is not None and len(plan.clients):
        rows = backend.evaluate_personal(weights, plan.clients, state_round)
        metrics |= summarize_clients(rows, "eval/personal")
    if personalize_round is not None:  # after the plain evaluation: its eval/clients/* win
        metrics |= evaluate_personalized(backend, weights, plan, personalize_round)
    metrics |= {f"{scope}/num_skipped_clients": float(n) for scope, n in plan.num_skipped.items()}
    metrics["sys/eval_s"] = time.perf_counter() - t0
    return metrics


# the global model's own losses (personalization, below, fine-tunes it first)
GLOBAL_LOSSES = ("eval/central/loss", "eval/clients/loss", "eval/heldout/loss")


def refuse_nonfinite_losses(metrics: Metrics, round_num: int | None) -> None:
    """Stops a run (or ``raysim eval``) whose global model scores a NaN or infinite loss: its
    weights are finite (they were checked) but its outputs overflow, so it is no usable model,
    whatever its accuracy reads (an argmax of NaN logits is class 0).

    Raises:
        NonFiniteError: naming the losses and the likely cause.
    """
    bad = {key: metrics[key] for key in GLOBAL_LOSSES if key in metrics and not np.isfinite(metrics[key])}
    if not bad:
        return
    when = f"round {round_num}: " if round_num is not None and round_num >= 0 else ""
    losses = ", ".join(f"{key} is {value}" for key, value in bad.items())
    raise NonFiniteError(
        f"{when}the global model's {losses}: its weights are finite but its outputs overflow; a "
        f"server step too large (lower algorithm.server.lr) or clients' steps (algorithm.local.lr, "
        f"algorithm.local.grad_clip) made it"
    )


def evaluate_predictor(
    backend: Backend, predictor: Predictor, plan: EvaluationPlan, heldout: bool = True
) -> Metrics:
    """Any predictor evaluated as the plan says (``Services.evaluate_weights``): on the central test
    set (``eval/central/*``) and a poisoned job's triggered one (``backdoor_accuracy``), the plan's
    clients' test splits (``eval/clients/*``, by domain too) and validation rows, and the held-out
    clients' test splits (with ``heldout``)."""
    [central] = predictor.rows(backend, None)
    metrics = scored("eval/central", central)  # none: the dataset has no central test data
    if plan.backdoor or plan.flip_success:
        # of the central test images whose label is not the trigger's, the share the predictor
        # assigns the trigger's label once stamped (``dataset.poison``); else of those whose label
        # the attack flips, the share predicted as the flipped label (``raysim.data.round_data``)
        [triggered] = predictor.rows(backend, None, "triggered")
        if triggered is not None:
            key = "backdoor_accuracy" if plan.backdoor else "flip_success"
            metrics[f"eval/central/{key}"] = triggered["accuracy"]
    if len(plan.clients):
        rows = evaluate_clients(backend, predictor, plan.clients)
        metrics |= summarize_clients(rows) | summarize_domains(rows, plan.domain_of)
    if plan.validation and len(plan.clients):
        rows = evaluate_clients(backend, predictor, plan.clients, split="validation")
        metrics |= summarize_clients(rows, "eval/validation")
    if heldout and len(plan.heldout):
        metrics |= summarize_clients(evaluate_clients(backend, predictor, plan.heldout), "eval/heldout")
    return metrics


def evaluate_personalized(
    backend: Backend, weights: NumpyParams, plan: EvaluationPlan, round_num: int
) -> Metrics:
    """The held-out clients (else the evaluated training clients) fine-tuned, and the transfer
    datasets, each fine-tuned when the plan says so and only evaluated otherwise."""
    config = plan.personalization
    metrics: Metrics = {}
    if len(plan.heldout):
        rows = (
            backend.personalize(weights, plan.heldout, config, round_num)
            if config
            else evaluate_clients(backend, Predictor.of([weights]), plan.heldout)
        )
        metrics |= summarize_clients(rows, "eval/heldout")
    elif config is not None:  # nobody held out: personalize the evaluated training clients
        metrics |= summarize_clients(
            backend.personalize(weights, plan.clients, config, round_num), "eval/clients"
        )
    for name, clients in plan.transfer.items():
        rows = (
            backend.personalize(weights, clients, config, round_num, name)
            if config and name in plan.personalize_transfer
            else evaluate_clients(backend, Predictor.of([weights]), clients, store=name)
        )
        metrics |= summarize_clients(rows, f"eval/transfer/{name}")
    return metrics


def evaluate_clients(
    backend: Backend, predictor: Predictor, clients: np.ndarray, store: str = "", split: str = "test"
) -> list[Metrics]:
    """The predictor on each client's ``split``, as rows with ``client_id`` (empty clients skipped)."""
    ids = tuple(int(c) for c in clients)
    rows = predictor.rows(backend, ids, split, store)
    return [{**row, "client_id": float(c)} for c, row in zip(ids, rows) if row is not None]


class TimeToTarget:
    """Logs, once, the round and the simulated time at which ``metric`` first reaches each value:
    ``tta/<metric>_<value>/round`` and ``.../sim_s`` (the clock at the round's end). A checkpoint
    keeps the values reached (``reached_values``), so a resumed run logs none of them again."""

    def __init__(self, config: TimeToTargetConfig) -> None:
        self.config = config
        self.pending = sorted(set(config.values), reverse=config.at_most)

    def reached_values(self) -> list[float]:
        """The values reached so far (a checkpoint's ``time_to_target``)."""
        return sorted(set(self.config.values) - set(self.pending))

    def restore(self, reached: list[float] | None) -> None:
        """The values a checkpoint says were reached (None: none, or an older file) pend no more."""
        self.pending = [v for v in self.pending if v not in set(reached or ())]

    def reached(self, metrics: Metrics, round_num: int, sim_clock_s: float | None) -> Metrics:
        """The ``tta/...`` metrics of the values this evaluation (``metrics``) reached first.

        Raises:
            ConfigError: the evaluation did not produce the metric; names the ones it did.
        """
        metric = self.config.metric
        if metric not in metrics:
            names = sorted(k for k in metrics if k.startswith("eval/"))
            raise ConfigError(
                [
                    f"evaluation.time_to_target.metric: {metric!r} is not evaluated in "
                    f"this job; evaluated: {', '.join(names)}"
                ]
            )
        value = metrics[metric]
        hit = [v for v in self.pending if (value <= v if self.config.at_most else value >= v)]
        self.pending = [v for v in self.pending if v not in hit]
        out: Metrics = {}
        for target in hit:
            out[f"tta/{metric}_{target:g}/round"] = float(round_num)
            if sim_clock_s is not None:
                out[f"tta/{metric}_{target:g}/sim_s"] = sim_clock_s
        return out
