"""Clients as devices: training speed and bandwidth (lognormal or a trace), and the fleet they make."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raysim.config.system import DevicesConfig, TraceDevices
from raysim.errors import ConfigError
from raysim.systems.availability import Always, Availability
from raysim.systems.traces import per_client, read_json, trace_clients

_SPEED, _BANDWIDTH = 12, 13  # purpose tags (raysim.systems.availability has 11)


@dataclass(frozen=True)
class Fleet:
    """Every client as a device: its training examples this round, speed and bandwidth, and when it
    is online. Arrays are indexed by client id."""

    num_examples: np.ndarray  # training examples per round (after engine.max_client_examples)
    examples_per_s: np.ndarray
    bytes_per_s: np.ndarray
    availability: Availability = field(default_factory=Always)


def device_speeds(config: DevicesConfig, num_clients: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(examples per second, bytes per second) of every client, a pure function of the seed."""
    if isinstance(config, TraceDevices):
        return _read_devices(config, num_clients)
    z_speed = np.random.default_rng([seed, _SPEED]).standard_normal(num_clients)
    z_bandwidth = np.random.default_rng([seed, _BANDWIDTH]).standard_normal(num_clients)
    return (
        config.examples_per_s * np.exp(config.examples_per_s_sigma * z_speed),
        config.bytes_per_s * np.exp(config.bytes_per_s_sigma * z_bandwidth),
    )


def _read_devices(config: TraceDevices, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    where = "system.devices.path"
    listed: dict[int, tuple[float, float]] = {}
    for key, device in trace_clients(read_json(config.path, where), config.path, where).items():
        try:
            speed, bandwidth = float(device["examples_per_s"]), float(device["bytes_per_s"])
        except (TypeError, KeyError, ValueError):
            shape = "{examples_per_s: x, bytes_per_s: y}"
            raise ConfigError(
                [f"{where}: {config.path}: client {key} must be {shape}, got {device!r}"]
            ) from None
        if not (speed > 0 and bandwidth > 0):
            raise ConfigError([f"{where}: {config.path}: client {key}'s speeds must be positive"])
        listed[key] = (speed, bandwidth)
    devices = per_client(listed, num_clients, config.missing, None, where, config.path)
    return np.array([d[0] for d in devices]), np.array([d[1] for d in devices])
