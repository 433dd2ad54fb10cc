# Everything runs from the virtual environment in .venv/ at the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint format train-cartpole clean

install: $(STAMP)

# Re-installs only when the project's dependencies change, so a second `make install` is quick.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest tests

lint: install
	$(BIN)/ruff check ksim examples tests benchmarks
	$(BIN)/ruff format --check ksim examples tests benchmarks
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix ksim examples tests benchmarks
	$(BIN)/ruff format ksim examples tests benchmarks

train-cartpole: install
	$(BIN)/python -m examples.cartpole

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
