# Everything starts from a fresh machine: `make run` and `make test` create .venv,
# install torch==2.13.0 first with pip (a local CPU wheel that pip's configuration
# points at; anything else pulls CUDA), then the project with its extras with uv,
# which installs the same packages as pip in a few seconds instead of ~32 s here (pip
# is the fallback, should uv fail: the same environment, slower). Compiled to bytecode
# as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine) nothing else would
# compile them, and every process (a Ray actor, a CLI run) would compile Ray's sources
# again on import (0.96 s instead of 0.52 s for `import ray` alone).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test check lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0 uv
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[dev,zookeeper,ray]' \
		|| $(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,zookeeper,ray]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/trainthrough compare

# The whole suite, what CI runs: three workers on two cores (vmstat: both cores busy
# from the first test to the last); every test that uses a worker's Ray runs on one of
# them, and the README's and the examples' commands each on one, in order (loadgroup).
# mypy (~20 s on one core from a fresh clone) starts first, beside ruff, lint-imports
# and compileall, which keep one core busy; its verdict counts all the same: the
# target fails if it does.
test: setup
	@$(BIN)/mypy src > $(VENV)/mypy.out 2>&1 & mypy=$$!; \
	$(BIN)/ruff check src tests benchmarks examples \
	&& PYTHONPATH=src $(BIN)/lint-imports --no-logo \
	&& $(BIN)/python -m compileall -q src \
	&& $(BIN)/python -m pytest -n 3 --dist loadgroup --durations=15; tests=$$?; \
	wait $$mypy; types=$$?; echo "mypy src:"; cat $(VENV)/mypy.out; \
	test $$tests -eq 0 && test $$types -eq 0

# The quick tier, for the edit-test loop: every test that starts no process (no gloo
# rank, no Ray, no ZooKeeper, no CLI subprocess; tests/conftest.py says which).
check: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -n 2 -m "not slow"

bench: setup
	$(BIN)/python benchmarks/sim_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache
