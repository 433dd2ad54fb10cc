# Everything runs from the virtual environment in .venv/ at the repo root.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# cpu (default): the JAX that runs MJX fastest on CPU, pinned by constraints-cpu.txt (README, "Supported JAX
# versions"). latest: the newest JAX pyproject.toml allows. cuda12 / cuda13: that extra, with current JAX.
JAX ?= cpu
# One stamp per choice, so switching JAX re-runs pip.
STAMP := $(VENV)/.installed-$(JAX)

ifeq ($(JAX),cpu)
PIP_TARGET := '.[dev]' -c constraints-cpu.txt
else ifeq ($(JAX),latest)
PIP_TARGET := '.[dev]' --upgrade
else
PIP_TARGET := '.[dev,$(JAX)]'
endif

.PHONY: install test lint format train-cartpole bench-brax clean

install: $(STAMP)

# Re-installs only when the dependencies or the JAX choice change, so a second `make install` is quick.
$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e $(PIP_TARGET)
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

# ksim vs Brax on the hopper, side by side; builds Brax's own venv (benchmarks/vs_brax/.venv) on first use.
bench-brax: install
	$(BIN)/python -m benchmarks.vs_brax

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
