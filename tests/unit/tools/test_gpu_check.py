"""The GPU check's own logic (tools/gpu_check.py, tools/gpu_bundle.py), on the CPU: which tests it
runs, how it reads pytest's verdict, and which wheels the bundle takes."""

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[3] / "tools"
sys.path.insert(0, str(TOOLS))

import gpu_bundle  # noqa: E402
import gpu_check  # noqa: E402


def test_the_gpu_tests_are_collected_from_the_files_that_mark_them():
    command = gpu_check.pytest_command()
    assert command[command.index("gpu") - 1] == "-m"
    files = [a for a in command if a.endswith(".py")]
    assert "tests/integration/cluster/test_resources.py" in files
    assert "tests/unit/test_gpu_check.py" not in files  # it names the marker, it marks nothing


def test_pytest_tally_reads_the_closing_line():
    output = "SKIPPED [1] tests/x.py:3: 2 passed earlier\n==== 1 passed, 5 deselected in 9.10s ====\n"
    assert gpu_check.pytest_tally(output) == {"passed": 1}
    assert gpu_check.pytest_tally("1 failed, 2 passed, 1 skipped, 2 errors in 3s") == {
        "failed": 1, "passed": 2, "skipped": 1, "errors": 2,
    }  # fmt: skip
    assert gpu_check.pytest_tally("no tests ran in 0.01s") == {}


def test_on_a_gpu_a_skipped_or_missing_test_is_no_pass():
    assert gpu_check.all_ran_and_passed({"passed": 1})
    assert not gpu_check.all_ran_and_passed({"passed": 1, "skipped": 1})
    assert not gpu_check.all_ran_and_passed({"skipped": 1})
    assert not gpu_check.all_ran_and_passed({})


def test_the_bundle_takes_exactly_the_pinned_wheels():
    assert gpu_bundle._is_pinned("ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", "ray==2.60.0")
    assert gpu_bundle._is_pinned("pydantic_core-2.50.5-cp312-cp312-manylinux.whl", "pydantic-core==2.50.5")
    assert not gpu_bundle._is_pinned("pydantic_core-2.50.5-cp312-cp312-manylinux.whl", "pydantic==2.50.5")
    assert not gpu_bundle._is_pinned("ray-2.59.0-cp312-cp312-manylinux2014_x86_64.whl", "ray==2.60.0")


def test_ray_is_pinned_as_the_project_pins_it():
    pyproject = (gpu_check.REPO / "pyproject.toml").read_text()
    ray_pin = next(p for p in gpu_bundle.PINS if p.startswith("ray=="))
    assert f'"ray[default]=={ray_pin.split("==")[1]}"' in pyproject


def test_a_step_past_the_checks_deadline_is_skipped_not_started(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "DEADLINE", gpu_check.time.perf_counter() + 5)
    result, output = gpu_check.run_step(None, "bench", ["false"], {})
    assert (
        result == {"ok": False, "skipped": f"the check's {gpu_check.TOTAL_S} s were spent"} and output == ""
    )
