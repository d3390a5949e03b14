"""Round-dependent client schedules (``raysim.train.schedules``) against hand-computed values.

IMA's regime switch (Zhou et al., arXiv:2305.07845, Sec. 6.3): lr0 0.01, x0.99 per round
until t_s, then x0.97 from the lr reached: lr_t = 0.01 * 0.99^t_s * 0.97^(t - t_s).
"""

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from raysim.train.local import LocalTrainConfig, round_epochs, round_lr, train_local
from raysim.train.schedules import Constant, Cyclic, EpochDecay, Exponential, Schedule, Step, Switch
from raysim.types import ClientData, DataSpec

IMA_SWITCH = Switch(from_round=10, before=Exponential(decay=0.99), after=Exponential(decay=0.97))


def test_exponential_and_constant():
    assert Exponential(decay=0.5).value(0.1, 3) == pytest.approx(0.0125)
    assert Constant().value(0.1, 7) == 0.1
    assert Constant(lr=5e-5).value(0.1, 7) == 5e-5


def test_the_ima_switch_continues_from_the_lr_reached():
    assert IMA_SWITCH.value(0.01, 9) == pytest.approx(0.01 * 0.99**9)
    assert IMA_SWITCH.value(0.01, 10) == pytest.approx(0.01 * 0.99**10)  # no jump at t_s
    assert IMA_SWITCH.value(0.01, 15) == pytest.approx(0.01 * 0.99**10 * 0.97**5)


def test_a_switch_before_its_start_is_exactly_the_first_schedule():
    # an IMA run equals its inner run bit for bit before t_s: the same float expression
    assert all(IMA_SWITCH.value(0.01, t) == 0.01 * 0.99**t for t in range(10))


def test_cyclic_sawtooth_and_triangle():
    saw = Cyclic(lr_min=0.01, period=5)  # 0.1 down to 0.01 over rounds 0..4, then again
    assert [saw.value(0.1, t) for t in range(6)] == pytest.approx([0.1, 0.0775, 0.055, 0.0325, 0.01, 0.1])
    tri = Cyclic(lr_min=0.02, period=4, shape="triangle")  # down over 2 rounds, up over 2
    assert [tri.value(0.1, t) for t in range(5)] == pytest.approx([0.1, 0.06, 0.02, 0.06, 0.1])


def test_step_decay_halves_every_stage():
    assert [Step(factor=0.5, every=2).value(0.8, t) for t in range(5)] == pytest.approx(
        [0.8, 0.8, 0.4, 0.4, 0.2]
    )


def test_ablations_start_from_the_lr_reached_at_the_switch():
    lr_max = 0.01 * 0.99**10
    small = Switch(from_round=10, before=Exponential(decay=0.99), after=Constant(lr=5e-5))
    cyclic = Switch(from_round=10, before=Exponential(decay=0.99), after=Cyclic(lr_min=5e-5, period=20))
    stages = Switch(from_round=10, before=Exponential(decay=0.99), after=Step(factor=0.5, every=20))
    assert small.value(0.01, 9) == pytest.approx(0.01 * 0.99**9) and small.value(0.01, 12) == 5e-5
    assert cyclic.value(0.01, 10) == pytest.approx(lr_max)
    assert cyclic.value(0.01, 29) == pytest.approx(5e-5)
    assert cyclic.value(0.01, 30) == pytest.approx(lr_max)
    assert [stages.value(0.01, t) for t in (29, 30, 50)] == pytest.approx([lr_max, lr_max / 2, lr_max / 4])


def test_epoch_decay_cuts_one_epoch_per_stage_from_its_start():
    decay = EpochDecay(from_round=10, every=20, min_epochs=1)
    assert [decay.epochs(5, t) for t in (0, 10, 29, 30, 50, 200)] == [5, 5, 5, 4, 3, 1]
    assert EpochDecay(every=1, min_epochs=2).epochs(3, 5) == 2


def test_schedules_parse_by_kind_and_nest():
    parsed = TypeAdapter(Schedule).validate_python(
        {
            "kind": "switch",
            "from_round": 10,
            "before": {"kind": "exponential", "decay": 0.99},
            "after": {"kind": "exponential", "decay": 0.97},
        }
    )
    assert parsed == IMA_SWITCH
    with pytest.raises(ValidationError, match="decay"):
        TypeAdapter(Schedule).validate_python({"kind": "exponential", "decay": 1.5})


def test_local_config_lr_decay_is_the_exponential_schedule():
    decayed = LocalTrainConfig(lr=0.1, lr_decay=0.9)
    scheduled = LocalTrainConfig(lr=0.1, lr_schedule={"kind": "exponential", "decay": 0.9})
    assert all(round_lr(decayed, t) == round_lr(scheduled, t) == 0.1 * 0.9**t for t in range(5))
    switched = LocalTrainConfig(lr=0.01, lr_schedule=IMA_SWITCH)
    assert round_lr(switched, 12) == pytest.approx(0.01 * 0.99**10 * 0.97**2)


def test_setting_both_lr_decay_and_lr_schedule_is_refused():
    with pytest.raises(ValidationError, match="lr_decay or lr_schedule, not both"):
        LocalTrainConfig(lr_decay=0.99, lr_schedule={"kind": "constant"})


def test_train_local_runs_the_epochs_of_the_round():
    import torch

    config = LocalTrainConfig(epochs=3, batch_size=4, epochs_schedule={"from_round": 1, "every": 1})
    data = ClientData({"x": np.ones((8, 2), np.float32), "y": np.zeros(8, np.int64)})
    spec = DataSpec(task="classification", input_shape=(2,), num_classes=2)
    steps = [
        train_local(torch.nn.Linear(2, 2), data, config, seed=0, spec=spec, round_num=r)["train/steps"]
        for r in range(4)
    ]
    assert [round_epochs(config, r) for r in range(4)] == [3, 3, 2, 1]
    assert steps == [6, 6, 4, 2]  # 2 batches per epoch
