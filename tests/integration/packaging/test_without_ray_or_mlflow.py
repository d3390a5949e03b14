"""raysim imports and runs a serial job where Ray and MLflow are not installed (the GPU machines):
both are imported only where they are used."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("ray", "mlflow"):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Missing())
    sys.path.insert(0, "tests/integration")
    from jobs import tiny_job
    from raysim import run

    result = run(tiny_job(engine={"num_rounds": 2}), output_dir=sys.argv[1])
    assert not any(m.split(".")[0] in ("ray", "mlflow") for m in sys.modules)
    print("accuracy", result.final["eval/clients/accuracy"])
    """
)


def test_a_serial_job_runs_without_ray_or_mlflow(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split("accuracy")[-1]) > 0.1
