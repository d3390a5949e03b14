"""The README's Python API example runs as written (fewer rounds, in-process, no MLflow)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    readme = (REPO / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    shown = '["engine.num_rounds=5"]'
    assert shown in code  # the example below is the README's, with cheaper overrides
    fast = '["engine.num_rounds=1", "resources.backend=serial", "tracking.enabled=false"]'
    code = code.replace(shown, fast).replace('output_dir=".raysim"', f'output_dir="{tmp_path}"')
    monkeypatch.chdir(REPO)
    exec(compile(code, "README.md", "exec"), {})
    accuracy, run_id, run_dir = capsys.readouterr().out.split()
    assert 0.0 < float(accuracy) <= 1.0 and run_id == "None" and Path(run_dir).is_relative_to(tmp_path)
