"""One driver per sweep: a second driver of a sweep is refused naming the first's pid and host and
the fix; a lock left by a driver that no longer runs is taken over and its owner named."""

import socket
import subprocess

import pytest

from raysim.errors import RaysimError
from raysim.sweep.sweep_lock import hold_sweep, release_sweep
from raysim.tracking.driver_lock import DRIVER_LOCK, this_driver


def test_a_second_driver_is_refused_naming_the_first_and_the_fix(tmp_path):
    hold = hold_sweep("tiny-0123abcd", tmp_path)
    assert (tmp_path / "sweeps" / "tiny-0123abcd" / DRIVER_LOCK).read_text().strip() == this_driver()
    with pytest.raises(RaysimError) as refused:  # this process is the first driver, and it runs
        hold_sweep("tiny-0123abcd", tmp_path)
    message = str(refused.value)
    assert message.startswith(f"sweep tiny-0123abcd is run by another driver: {this_driver()} holds ")
    assert "let it finish (or stop it), then run the same command again" in message
    assert hold_sweep("other-4567abcd", tmp_path).dead_driver == ""  # another sweep is free
    release_sweep(hold)
    again = hold_sweep("tiny-0123abcd", tmp_path)
    assert again.dead_driver == ""  # released: nobody's lock was taken over
    release_sweep(again)


def test_a_lock_left_by_a_driver_that_no_longer_runs_is_taken_over_and_names_it(tmp_path):
    gone = _dead_pid()
    dead = f"pid {gone} on {socket.gethostname()}, started 2026-01-01 00:00:00 UTC"
    folder = tmp_path / "sweeps" / "tiny-0123abcd"
    folder.mkdir(parents=True)
    (folder / DRIVER_LOCK).write_text(dead + "\n")
    hold = hold_sweep("tiny-0123abcd", tmp_path)
    assert hold.dead_driver == dead
    assert (folder / DRIVER_LOCK).read_text().strip() == this_driver()
    release_sweep(hold)
    assert not (folder / DRIVER_LOCK).exists()


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
