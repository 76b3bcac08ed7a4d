# Everything starts from a fresh machine: `make run` and `make test` create .venv,
# install torch==2.13.0 first (a local CPU wheel; anything else pulls CUDA), then
# the project with its extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test check lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,zookeeper,ray]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/trainthrough compare

# The whole suite, what CI runs: three workers on two cores (the tests wait on processes
# about half the time); every test that uses the session's Ray runs on one of them, and
# the README's and the examples' commands each on one, in order (loadgroup).
test: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy src
	PYTHONPATH=src $(BIN)/lint-imports --no-logo
	$(BIN)/python -m pytest -n 3 --dist loadgroup --durations=15

# The quick tier, for the edit-test loop: every test that starts no process (no gloo
# rank, no Ray, no ZooKeeper, no CLI subprocess; tests/conftest.py says which).
check: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -n 2 -m "not slow"

bench: setup
	$(BIN)/python benchmarks/sim_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache
