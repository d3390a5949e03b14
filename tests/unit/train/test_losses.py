"""The losses toolkit beyond FedLC's calibration (tested in tests/unit/algorithms/test_fedlc.py):
the balanced softmax, a client's label counts and the shared ``logit_calibration`` option.

Balanced softmax by hand: logits (0, 0), counts (3, 1), label 0: softmax(log 3, log 1) gives
p_0 = 3/4, so the loss is -log(3/4) = 0.2877; with counts (1, 0) class 1 gets -inf, p_0 = 1, loss 0.
"""

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from raysim.train.losses import LogitCalibrationConfig, balanced_softmax_loss, client_label_counts
from raysim.types import ClientData


def test_balanced_softmax_by_hand():
    loss = balanced_softmax_loss(torch.zeros(1, 2), torch.tensor([0]), torch.tensor([3.0, 1.0]))
    assert float(loss) == pytest.approx(-math.log(0.75), rel=1e-6)


def test_balanced_softmax_drops_a_class_with_no_examples():
    logits = torch.tensor([[0.5, 2.0]], requires_grad=True)
    loss = balanced_softmax_loss(logits, torch.tensor([0]), torch.tensor([1.0, 0.0]))
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert logits.grad is not None and logits.grad.abs().sum() == 0


def test_client_label_counts_counts_the_labels_and_reads_empty_data_as_zeros():
    data = ClientData({"x": np.zeros((4, 2), np.float32), "y": np.array([2, 0, 2, 2])})
    assert client_label_counts(data, 4).tolist() == [1.0, 0.0, 3.0, 0.0]
    assert client_label_counts(ClientData({}), 3).tolist() == [0.0, 0.0, 0.0]


def test_logit_calibration_option():
    assert LogitCalibrationConfig().strength == 0.1
    with pytest.raises(ValidationError, match="strength"):
        LogitCalibrationConfig(strength=-0.1)
    with pytest.raises(ValidationError, match="Extra inputs"):
        LogitCalibrationConfig.model_validate({"rho": 0.1})
