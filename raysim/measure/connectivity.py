"""Probes of the round's local models: FedGuCci's group barrier and IMA's loss decomposition.

Both keep the round's local models (``keeps_local_models``) and measure them after the server
update on common data: the dataset's central test set or the cohort's round data
(``CohortModelsConfig.data``). The probe contract is ``raysim.measure.barrier``'; the registry imports this
module with it.

    evaluation:
      probes: [{name: group_barrier, every: 5, data: cohort}, {name: loss_decomposition, every: 10}]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Literal, cast

import numpy as np
import torch
from pydantic import Field
from torch import nn

from raysim.errors import ConfigError
from raysim.measure import estimators as E
from raysim.measure import landscape as L
from raysim.measure.points import NoExamplesError
from raysim.measure.weight_space import distance, mix
from raysim.probe import ClientView, ProbeConfig, ProbeRound
from raysim.registry import register
from raysim.services import LABELS, LOGITS, MapRequest, Services
from raysim.types import Metrics, NumpyParams, RunInfo


class CohortModelsConfig(ProbeConfig, frozen=True, extra="forbid"):
    """Options of the probes that measure the round's local models on common data."""

    # "central": the dataset's central test set; "cohort": the cohort's round data
    data: Literal["central", "cohort"] = "central"
    # the local models' mixing weights: their round data sizes (FedAvg's) or 1/K each
    weights: Literal["data", "uniform"] = "data"


class GroupBarrierConfig(CohortModelsConfig, frozen=True, extra="forbid"):
    pairwise: bool = False  # also the midpoint barrier of the cohort's first two local models
    samples: int = Field(0, ge=0)  # Dirichlet(1) draws of lam for a Monte-Carlo max (0: none)


@register("probe", "group_barrier")
class GroupBarrier:
    """FedGuCci's group barrier: what fusing the round's local models loses against their mean.

    Li et al., KDD 2025, arXiv:2402.18949, Def. 3.6: the measure
    behind "FedGuCci lowers the group barrier of the local models against FedAvg".

    With ``lam`` the clients' round data sizes (``weights: data``, the FedAvg fusion point) or
    uniform, evaluated on the central test set (``data: central``) or the cohort's pooled round
    data (``data: cohort``), it logs ``group_barrier/loss_barrier = L(sum lam_k w_k) -
    sum lam_k L(w_k)`` (absolute), ``group_barrier/accuracy_barrier = 1 - A(fused) /
    sum lam_k A(w_k)`` (relative; both signed: negative when the fusion beats its members),
    ``group_barrier/fused_*`` and ``group_barrier/mean_local_*`` (loss, accuracy and the
    dataset's scores). ``samples: S`` adds ``group_barrier/loss_barrier_max`` and
    ``group_barrier/accuracy_barrier_max`` over S Dirichlet(1) draws of lam; ``pairwise: true``
    adds ``group_barrier/pairwise_loss_barrier`` and ``group_barrier/pairwise_accuracy_barrier``,
    the barriers at the midpoint of the first two clients' models (FedGuCci Table 9 reports the
    midpoint). No accuracy barrier for a regression task.
    """

    Config = GroupBarrierConfig
    keeps_local_models = True

    def __init__(self, config: GroupBarrierConfig) -> None:
        self.config = config

    def before_training(self, view: ClientView) -> Metrics:
        return {}

    def after_training(self, view: ClientView) -> Metrics:
        return {"num_examples": float(len(view.data))}

    def check(self, info: RunInfo) -> None:
        raise_problems(data_problems("group_barrier", self.config, info))

    def summarize(self, probe_round: ProbeRound, services: Services[object]) -> Metrics:
        ids, models, sizes = kept_models(probe_round)
        if len(models) < 2:
            return {}
        clients, split = evaluation_data(self.config.data, ids)
        lam = sizes if self.config.weights == "data" else None
        seed = (services.info.seed, probe_round.round_num)
        out = L.group_barrier(
            services,
            models,
            lam,
            clients,
            split,
            round_num=probe_round.round_num,
            samples=self.config.samples,
            seed=seed,
        )
        if self.config.pairwise:
            pair = L.group_barrier(
                services, models[:2], None, clients, split, round_num=probe_round.round_num
            )
            out |= {f"pairwise_{name}": pair[name] for name in L.BARRIERS if name in pair}
        return {f"group_barrier/{key}": value for key, value in out.items()}


_CKA_STREAM = 0xC4A  # the CKA rows' random stream, apart from the variance curve's subsets
# The per-example losses each decomposition term is logged in: IMA's own and the training loss
LOSSES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "squared_error": E.squared_error,
    "cross_entropy": E.cross_entropy,
}


class LossDecompositionConfig(CohortModelsConfig, frozen=True, extra="forbid"):
    cka_examples: int = Field(2000, ge=2)  # the probe batch for CKA: n evaluation examples, seeded
    subsets: int = Field(1, ge=1)  # random subsets per size j for the variance curve
    mean_of: list[Annotated[int, Field(ge=1)]] | None = (
        None  # the sizes j of the variance curve (None: 1..K; larger are skipped)
    )


@register("probe", "loss_decomposition")
class LossDecomposition:
    """IMA's loss decomposition: bias, locality, variance and covariance of the local models.

    Zhou et al., IEEE TMC 2024, arXiv:2305.07845, Theorem 1 and Figs. 2-4; the estimators are
    that paper's.

    Classification only. Each loss is logged in the paper's form, the squared error of the
    softmax to the one-hot label (``/squared_error``, in [0, 2]), and as ``/cross_entropy``
    (``LOSSES``, named as ``raysim.measure.estimators`` names them). With K local models w_k, data sizes
    n_k, ``w = sum_k lam_k w_k`` (``weights``) and the evaluation data E (``data``: the central
    test set, or the pooled round data of the cohort), it logs under ``decomposition/``:

    - ``train_bias/*``: mean over k of w_k's loss on its own round data D_k (the worker hook,
      right after training). f_bar_k is approximated by the single trained model.
    - ``heter_bias/*``: mean over k of w_k's loss on data client k did not train on: E for
      ``data: central`` (test data stands in for D minus D_k), else the other cohort clients'
      round data (D minus D_k restricted to the cohort).
    - ``locality/max``, ``locality/mean``: ``||w_k - w||_2`` over the flattened float params.
    - ``variance/spread``: ``mean_x mean_k ||p_k(x) - p_bar(x)||^2`` on E (softmax outputs): the
      variance term of IMA's eq. (2) over the cohort's models. ``variance/mean_of_{j}/*``: the
      loss on E of the uniform average of j random local models, j = 1..K or the sizes in
      ``mean_of`` (``subsets`` draws each, averaged; seeded by the run seed and round), Fig. 4's
      variance curve.
    - ``covariance/cka``: the mean pairwise linear CKA of the local models' logits on
      ``cka_examples`` examples of E drawn at random (seeded by the run seed and round, so from
      every client's data), Fig. 4's covariance measure.
    - ``fused/*``: the loss of w on E, the left-hand side the factors bound.

    Clients without round examples did not train and are left out (their model is the broadcast).
    Everything on E takes one ``map_clients`` call for the LOGITS of all the points (the K models,
    w and the averages) plus one for the LABELS.
    """

    Config = LossDecompositionConfig
    keeps_local_models = True

    def __init__(self, config: LossDecompositionConfig) -> None:
        self.config = config

    def before_training(self, view: ClientView) -> Metrics:
        return {}

    def after_training(self, view: ClientView) -> Metrics:
        row = {"num_examples": float(len(view.data))}
        labels = view.data.arrays.get("y")
        if not len(view.data):
            return row  # no round examples: the client did not train, summarize leaves it out
        if labels is None or labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            return row  # not classification: check refused the run
        logits = model_outputs(view.model, view.data.arrays["x"])
        return row | {f"train_{form}": float(loss(logits, labels).mean()) for form, loss in LOSSES.items()}

    def check(self, info: RunInfo) -> None:
        problems = data_problems("loss_decomposition", self.config, info)
        if info.spec.task != "classification":
            problems.append(
                f"evaluation.probes: loss_decomposition needs a classification dataset, not "
                f"{info.spec.task}; remove the probe from this job"
            )
        raise_problems(problems)

    def summarize(self, probe_round: ProbeRound, services: Services[object]) -> Metrics:
        ids, models, sizes = trained_models(probe_round)
        if len(models) < 2:
            return {}
        fused = mix(models, sizes if self.config.weights == "data" else np.ones(len(models)))
        round_num = probe_round.round_num
        subsets = self._subsets(len(models), np.random.default_rng((services.info.seed, round_num)))
        averages = [mix([models[i] for i in subset], np.ones(len(subset))) for subset in subsets]
        on = Outputs.measure(services, [*models, fused, *averages], self.config.data, ids, round_num)
        count = len(models)
        rows = [row for row in probe_round.rows if int(row["client_id"]) in ids]
        out: Metrics = {}
        for form in LOSSES:
            out[f"train_bias/{form}"] = float(np.mean([row[f"train_{form}"] for row in rows]))
            unseen = [on.unseen_loss(form, k) for k in range(count)]
            out[f"heter_bias/{form}"] = float(np.mean([loss for loss in unseen if loss is not None]))
            out[f"fused/{form}"] = on.loss(form, count)
            for size in sorted({len(subset) for subset in subsets}):
                points = [count + 1 + i for i, subset in enumerate(subsets) if len(subset) == size]
                out[f"variance/mean_of_{size}/{form}"] = float(np.mean([on.loss(form, p) for p in points]))
        local_logits = [on.pooled(k) for k in range(count)]
        out["variance/spread"] = E.output_spread(local_logits)
        rows_for_cka = cka_sample(
            len(local_logits[0]), self.config.cka_examples, services.info.seed, round_num
        )
        out["covariance/cka"] = E.mean_pairwise_cka([z[rows_for_cka] for z in local_logits])
        distances = [distance(model, fused) for model in models]
        out["locality/max"], out["locality/mean"] = float(np.max(distances)), float(np.mean(distances))
        return {f"decomposition/{key}": value for key, value in out.items()}

    def _subsets(self, count: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Random subsets of the K local models for the variance curve, ``subsets`` per size j."""
        wanted = (
            range(1, count + 1)
            if self.config.mean_of is None
            else [j for j in self.config.mean_of if j <= count]
        )
        return [rng.choice(count, j, replace=False) for j in wanted for _ in range(self.config.subsets)]


@dataclass(frozen=True)
class Outputs:
    """Every point's logits on the evaluation data and its labels, in parts: one per client in
    cohort order (None where a client has no examples), or one for the central test set."""

    logits: list[list[np.ndarray | None]]  # [point][part]
    labels: list[np.ndarray | None]  # [part]
    by_client: bool

    @classmethod
    def measure(
        cls, services: Services[object], points: list[NumpyParams], data: str, ids: list[int], round_num: int
    ) -> Outputs:
        """One ``map_clients`` call for the logits of all the points, one for the labels."""
        clients, split = evaluation_data(data, ids)
        request = MapRequest(LOGITS, points, clients, split=split, round_num=round_num)
        logits = services.map_clients(request)
        [labels] = services.map_clients(replace(request, task=LABELS, points=points[:1]))
        if all(y is None or not len(y) for y in labels):
            raise NoExamplesError(clients, split)
        return cls(logits, labels, by_client=clients is not None)

    def pooled(self, point: int) -> np.ndarray:
        return self._pool(point, range(len(self.labels)))[0]

    def loss(self, form: str, point: int) -> float:
        return _loss(form, *self._pool(point, range(len(self.labels))))

    def unseen_loss(self, form: str, k: int) -> float | None:
        """Model k's loss on the data client k did not train on (all of it on the central set);
        None when the other clients have no examples."""
        logits, labels = self._pool(
            k, [i for i in range(len(self.labels)) if not (self.by_client and i == k)]
        )
        return _loss(form, logits, labels) if len(labels) else None

    def _pool(self, point: int, parts: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """The point's logits and the labels of the parts with examples (empty arrays if none);
        ``measure`` made sure some part has examples."""
        kept = [(self.logits[point][i], self.labels[i]) for i in parts if _has_examples(self.labels[i])]
        if not kept:
            return np.zeros((0, 0)), np.zeros(0, dtype=np.int64)
        return (
            np.concatenate([cast(np.ndarray, z) for z, _ in kept]),
            np.concatenate([cast(np.ndarray, y) for _, y in kept]),
        )


def _has_examples(labels: np.ndarray | None) -> bool:
    return labels is not None and len(labels) > 0


def cka_sample(total: int, count: int, seed: int, round_num: int) -> np.ndarray:
    """Which of ``total`` pooled evaluation examples the CKA uses: ``count`` of them drawn at
    random (seeded by the run seed and round), in order; all when there are no more. A prefix would
    hold the first cohort client's data alone, the pooled data being in cohort order."""
    if total <= count:
        return np.arange(total)
    return np.sort(np.random.default_rng((seed, round_num, _CKA_STREAM)).choice(total, count, replace=False))


def _loss(form: str, logits: np.ndarray, labels: np.ndarray) -> float:
    return float(LOSSES[form](logits, labels).mean())


def kept_models(probe_round: ProbeRound) -> tuple[list[int], list[NumpyParams], list[float]]:
    """The round's clients that returned a local model (cohort order): ids, models, data sizes."""
    sizes = {int(row["client_id"]): row.get("num_examples", 0.0) for row in probe_round.rows}
    ids = [c for c in probe_round.client_ids if c in probe_round.local_models]
    return ids, [probe_round.local_models[c] for c in ids], [sizes[c] for c in ids]


def trained_models(probe_round: ProbeRound) -> tuple[list[int], list[NumpyParams], list[float]]:
    """``kept_models`` less the clients without round examples: they did not train, so their
    model is the broadcast, with no training loss and nothing to be unseen by it."""
    kept = [(c, m, n) for c, m, n in zip(*kept_models(probe_round)) if n > 0]
    return [c for c, _, _ in kept], [m for _, m, _ in kept], [n for _, _, n in kept]


def evaluation_data(data: str, ids: Sequence[int]) -> tuple[list[int] | None, str]:
    """``map_clients``' clients and split for ``data``: the central test set or the round data."""
    return (None, "test") if data == "central" else (list(ids), "round")


def data_problems(probe: str, config: CohortModelsConfig, info: RunInfo) -> list[str]:
    """What keeps the probe's ``data`` from this run: ``central`` needs a central test set."""
    if config.data == "central" and not info.has_central_test:
        return [
            f"evaluation.probes: {probe} with data: central needs a dataset with a central test "
            f"set; this one has none: set data: cohort"
        ]
    return []


def raise_problems(problems: list[str]) -> None:
    if problems:
        raise ConfigError(problems)


def model_outputs(model: nn.Module, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """The model's outputs for inputs ``x``, batch by batch on the model's device (a hook's
    forward pass: the worker has set eval mode and disabled gradients)."""
    device = next(model.parameters()).device
    parts = [
        model(torch.as_tensor(x[start : start + batch_size]).to(device)).float().cpu().numpy()
        for start in range(0, len(x), batch_size)
    ]
    return np.concatenate(parts)
