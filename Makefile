# Everything starts from a fresh machine: `make run` and `make test` create .venv,
# install torch==2.13.0 first (a local CPU wheel; anything else pulls CUDA), then
# the project with its extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,zookeeper,ray]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/trainthrough compare

test: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy src
	PYTHONPATH=src $(BIN)/lint-imports --no-logo
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python benchmarks/sim_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache
