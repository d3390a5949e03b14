"""A model on one client's data (raysim/measure/evaluate.py): a batch with nothing to score."""

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.measure.evaluate import evaluate
from raysim.types import ClientData, DataSpec

PAD, VOCAB = 0, 7
SPEC = DataSpec("causal_lm", (4,), VOCAB, pad_token_id=PAD)


def test_a_batch_of_padding_alone_adds_nothing_and_a_nan_over_real_tokens_still_shows():
    """Batches of 2: the first holds real tokens, the second padding alone (its mean loss is 0/0).
    The loss must be the first batch's mean over its real targets, computed here in plain torch."""
    torch.manual_seed(0)
    model = nn.Embedding(VOCAB, VOCAB)  # tokens (B, T) -> logits (B, T, V)
    x = np.array([[3, 1, 4, 1], [5, 2, 6, PAD], [4, PAD, PAD, PAD], [2, PAD, PAD, PAD]], dtype=np.int64)
    metrics = evaluate(model, ClientData({"x": x}), SPEC, batch_size=2)
    tokens = torch.as_tensor(x[:2])
    with torch.no_grad():
        logits = model(tokens)[:, :-1].reshape(-1, VOCAB)
    targets = tokens[:, 1:].reshape(-1)
    expected = F.cross_entropy(logits[targets != PAD], targets[targets != PAD]).item()
    assert metrics["num_examples"] == 5  # the real targets: 3 + 2
    assert math.isclose(metrics["loss"], expected, rel_tol=1e-6), (metrics["loss"], expected)
    with torch.no_grad():
        model.weight[3].fill_(float("nan"))  # token 3's logits: a real target's loss is NaN
    assert math.isnan(evaluate(model, ClientData({"x": x}), SPEC, batch_size=2)["loss"])
