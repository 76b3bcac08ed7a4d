# Everything starts from a fresh machine: `make run` and `make test` create .venv, and
# install the project with its extras with uv, which installs and compiles to bytecode
# on every core (pip, one file at a time, took 14 of its 21 s on torch alone). torch
# comes first from pip's own choice: `pip download torch==2.13.0` finds the local CPU
# wheel that pip's configuration points at (anything else pulls CUDA), and uv installs
# that file. Compiled as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine)
# nothing else would compile them, and every process (a Ray actor, a CLI run) would
# compile Ray's sources again on import (0.96 s instead of 0.52 s for `import ray`).
# Should uv fail, pip installs the same environment, slower.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
WHEELS := $(VENV)/wheels

.PHONY: setup run test check lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile --disable-pip-version-check uv
	$(BIN)/python -m pip download -q --no-deps --disable-pip-version-check -d $(WHEELS) \
		torch==2.13.0
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(WHEELS)/torch-*.whl \
		-e '.[dev,zookeeper,ray]' \
		|| $(BIN)/python -m pip install -q --disable-pip-version-check $(WHEELS)/torch-*.whl \
		-e '.[dev,zookeeper,ray]'
	rm -rf $(WHEELS)
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/trainthrough compare

# The whole suite, what CI runs: three workers on two cores (vmstat: both cores busy
# from the first test to the last); every test that uses a worker's Ray runs on one of
# them, and the README's and the examples' commands each on one, in order (loadgroup).
# ruff, lint-imports and mypy (~25 s on one core from a fresh clone, mypy most of it)
# run beside the tests rather than before them; their verdicts count all the same: the
# target fails if any of them does.
test: setup
	@# Hundreds of processes (ranks, actors, CLI runs) import the package: compiled once
	@# here, not in each (PYTHONDONTWRITEBYTECODE, where set, would stop Python caching it).
	$(BIN)/python -m compileall -q src
	@($(BIN)/ruff check src tests benchmarks examples \
	  && PYTHONPATH=src $(BIN)/lint-imports --no-logo && $(BIN)/mypy src) \
	  > $(VENV)/lint.out 2>&1 & lint=$$!; \
	$(BIN)/python -m pytest -n 3 --dist loadgroup --durations=15; tests=$$?; \
	wait $$lint; lints=$$?; echo "ruff, lint-imports, mypy src:"; cat $(VENV)/lint.out; \
	test $$tests -eq 0 && test $$lints -eq 0

# The quick tier, for the edit-test loop: every test that starts no process (no gloo
# rank, no Ray, no ZooKeeper, no CLI subprocess; tests/conftest.py says which).
check: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -n 2 -m "not slow"

bench: setup
	$(BIN)/python benchmarks/sim_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache
