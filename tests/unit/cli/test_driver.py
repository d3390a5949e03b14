"""The driver's SIGTERM (raysim/cli/driver.py): an exit Python cannot raise where the signal lands
ends the run all the same, without Python's "Exception ignored" report (issue 29, item 8)."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DRIVER = """
import signal
from raysim.cli.driver import exit_on_sigterm
from raysim.stop_request import honour_stop_request

exit_on_sigterm()


class Dropped:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)  # lands in a destructor, as in a garbage collection


Dropped()
print("went on")
{after}
"""


def driver(after: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    code = DRIVER.format(after=after)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_an_exit_lost_in_a_destructor_is_honoured_without_pythons_report():
    """Python printed "Exception ignored in: <function Dropped.__del__>" and SystemExit's traceback."""
    done = driver("honour_stop_request()")
    assert (done.returncode, done.stdout, done.stderr) == (143, "went on\n", "")


def test_other_lost_exceptions_are_still_reported():
    done = driver("class Other:\n    def __del__(self):\n        raise ValueError('boom')\n\nOther()")
    assert "Exception ignored in" in done.stderr and "ValueError: boom" in done.stderr
