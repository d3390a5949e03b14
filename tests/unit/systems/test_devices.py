"""Clients as devices: lognormal speeds from the seed, and device traces (raysim.systems.devices)."""

import numpy as np
import pytest
from fleets import write

from raysim.config.system import (
    LognormalDevices,
    TraceDevices,
)
from raysim.errors import ConfigError
from raysim.systems.devices import device_speeds


def test_devices_draw_lognormal_speeds_per_client_from_the_seed():
    speed, bandwidth = device_speeds(LognormalDevices(examples_per_s_sigma=0.0), 5, seed=0)
    assert np.all(speed == 100.0) and not np.all(bandwidth == 1.25e6)
    a, _ = device_speeds(LognormalDevices(), 4000, seed=1)
    assert np.array_equal(a, device_speeds(LognormalDevices(), 4000, seed=1)[0])
    assert np.median(a) == pytest.approx(100.0, rel=0.05) and np.std(np.log(a)) == pytest.approx(
        0.5, rel=0.05
    )


def test_device_traces(tmp_path):
    path = write(tmp_path, {"clients": {"0": {"examples_per_s": 5, "bytes_per_s": 100},
                                        "2": {"examples_per_s": 7, "bytes_per_s": 300}}})  # fmt: skip
    speed, bandwidth = device_speeds(TraceDevices(path=path, missing="cycle"), 4, seed=0)
    assert speed.tolist() == [5, 7, 7, 7] and bandwidth.tolist() == [100, 300, 300, 300]  # 1 -> 2, 3 -> 2
    with pytest.raises(ConfigError, match="system.devices.path: .*no entry for 2 of the 4"):
        device_speeds(TraceDevices(path=path), 4, seed=0)
    with pytest.raises(ConfigError, match="system.devices.path: cannot read"):
        device_speeds(TraceDevices(path=str(tmp_path / "absent.json")), 4, seed=0)
