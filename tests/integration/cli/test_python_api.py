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


def test_the_quickstart_notebook_runs_cell_by_cell(tmp_path, monkeypatch, tracking_uri):
    """Its code cells, in order, in one ``__main__`` namespace as a kernel runs them (exec: no
    Jupyter kernel among the test dependencies; the cells are plain Python, no magics)."""
    import json

    from matplotlib.figure import Figure

    from raysim import registry

    notebook = json.loads((REPO / "docs" / "notebooks" / "quickstart.ipynb").read_text())
    cells = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert not [c for c in cells if re.search(r"^\s*[%!]", c, re.M)]  # exec would not run magics
    monkeypatch.chdir(tmp_path)  # its run folders land here, its runs in tracking_uri's store
    namespace = {"__name__": "__main__"}
    try:
        for i, cell in enumerate(cells):
            exec(compile(cell, f"quickstart.ipynb, code cell {i}", "exec"), namespace)
    finally:
        registry._entries["algorithm"].pop("damped_fedavg", None)  # the notebook's plugin
    assert namespace["DampedFedAvg"].__module__ == "__main__"
    table = namespace["comparison"].table
    assert list(table["run"]) == ["fedavg", "damped"] and table["eval/clients/accuracy"].between(0, 1).all()
    assert isinstance(namespace["comparison"].figure(), Figure)
    listed = namespace["raysim"].runs("notebook")
    assert sorted(listed["name"]) == ["damped", "fedavg"] and set(listed["status"]) == {"FINISHED"}
