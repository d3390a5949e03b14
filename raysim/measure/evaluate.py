"""A model evaluated on one client's data: the row every evaluation and probe pools over clients."""

from __future__ import annotations

import torch
from torch import nn

from raysim.measure import scores
from raysim.measure.pooling import perplexity
from raysim.train.batching import iterate_batches, to_tensors
from raysim.train.task_loss import outputs_loss
from raysim.types import ClientData, DataSpec, Metrics


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: ClientData,
    spec: DataSpec,
    device: torch.device | str = "cpu",
    batch_size: int = 512,
) -> Metrics:
    """Loss and accuracy of ``model`` on ``data`` (accuracy per token for causal LM; none for
    regression), and the scores ``spec.metrics`` names, each with the additive statistics it was
    computed from (``sums/...`` keys, which ``raysim.measure.pooling.pool_rows`` combines over clients)."""
    scores.check_metrics(spec)
    model.eval()
    loss_sum: torch.Tensor | float = 0.0
    correct: torch.Tensor | int = 0
    seen: torch.Tensor | int = 0
    statistics: dict[str, torch.Tensor] = {}
    for batch in iterate_batches(to_tensors(data, device), batch_size):
        outputs = model(batch["x"])
        loss, num_correct, num_items = outputs_loss(outputs, batch, spec)
        loss_sum, correct, seen = loss_sum + _summed(loss, num_items), correct + num_correct, seen + num_items
        if spec.metrics:  # causal LM batches have no "y"
            for name, value in scores.batch_statistics(spec, outputs, batch["y"]).items():
                statistics[name] = statistics[name] + value if name in statistics else value
    num_seen = float(seen)
    metrics = {"loss": float(loss_sum) / max(num_seen, 1.0), "num_examples": num_seen}
    if spec.task != "regression":  # a regressor's "accuracy" would be a meaningless 0
        metrics["accuracy"] = float(correct) / max(num_seen, 1.0)
    if spec.task == "causal_lm":  # per-token cross-entropy is log-perplexity (nats)
        metrics["perplexity"] = perplexity(metrics["loss"])
    if spec.metrics:
        sums = scores.statistics_metrics(statistics)
        metrics |= scores.finish(spec.metrics, sums) | sums
    return metrics


def _summed(loss: torch.Tensor, num_items: torch.Tensor | int) -> torch.Tensor:
    """A batch's mean ``loss`` times its ``num_items``; 0 for a batch with nothing to score (a
    causal LM batch of padding alone, whose mean is 0/0 = NaN), where a NaN over scored items
    still shows (the run refuses a global model's NaN loss)."""
    if isinstance(num_items, torch.Tensor):
        return torch.where(num_items > 0, loss * num_items, torch.zeros_like(loss))
    return loss * num_items
