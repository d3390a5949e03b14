# `make demo` and `make test` each build .venv on first use; the stamp re-installs when pyproject changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-all bench gpu-bundle gpu-check gpu-check-dry clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/raysim run jobs/quickstart.yaml

# lint, format and type-check first: all cheaper than the suite (mypy caches in .mypy_cache/);
# the format check makes a module's line count the formatter's (tests/unit/test_layout.py).
# The suite runs in 3 processes (pytest-xdist), each test file whole in one (its module fixtures
# set up once): its Ray start-ups and subprocesses leave a core idle often enough that 3 took
# 13-15 minutes where 1 took 22, on 2 cores.
test: $(STAMP)
	$(BIN)/ruff check raysim algorithms datasets tests tools
	$(BIN)/ruff format --check raysim algorithms datasets tests tools
	$(BIN)/mypy raysim algorithms datasets tools
	$(BIN)/python -m pytest -q -n 3 --dist loadfile

# the tests marked slow: signalled drivers and servers, a second Ray, a real MiniLM (docs/reliability.md)
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ""

bench: $(STAMP)
	$(BIN)/raysim bench jobs/bench/pfl_cifar10.yaml

# The GPU check (docs/performance.md): gpu-bundle here, where PyPI is reachable; gpu-check on a GPU
# machine, with .gpu/ carried beside the checkout; gpu-check-dry here, on the CPU, small.
gpu-bundle:
	$(PYTHON) tools/gpu_bundle.py

gpu-check:
	$(PYTHON) tools/gpu_check.py

gpu-check-dry: $(STAMP)
	$(BIN)/python tools/gpu_check.py --cpu-dry-run

clean:
	rm -rf $(VENV) mlflow.db mlruns .raysim .mypy_cache
