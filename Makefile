# Everything runs from the virtual environment in .venv/ at the repo root.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# cpu (default): the JAX that runs MJX fastest on CPU, pinned by constraints-cpu.txt (docs/mjx.md).
# latest: the newest JAX pyproject.toml allows. cuda12 / cuda13: that extra, with current JAX.
JAX ?= cpu
# One stamp per choice, so switching JAX re-runs pip.
STAMP := $(VENV)/.installed-$(JAX)
FFI_LIB := ksim/physics/ffi/_native_ffi.so

ifeq ($(JAX),cpu)
PIP_TARGET := '.[dev]' -c constraints-cpu.txt
else ifeq ($(JAX),latest)
PIP_TARGET := '.[dev]' --upgrade
else
PIP_TARGET := '.[dev,$(JAX)]'
endif

.PHONY: install test test-warp lint format train-cartpole bench-brax clean

install: $(STAMP) $(FFI_LIB)

# The native engine's XLA FFI extension (ksim/physics/build_ffi.py), rebuilt when its source or the install
# changes. A failed build does not fail the install: physics_impl='mujoco' then says why in one line at start
# and steps through Python callbacks.
$(FFI_LIB): $(STAMP) ksim/physics/ffi/native_ffi.cc ksim/physics/build_ffi.py
	$(BIN)/python -m ksim.physics.build_ffi

# Re-installs only when the dependencies or the JAX choice change, so a second `make install` is quick.
$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e $(PIP_TARGET)
	touch $(STAMP)

# Each test file runs in a process of its own (programs compiled by one still reach the others through the
# persistent compilation cache): jaxlib 0.9.2's XLA:CPU crashed (SIGSEGV in executable.serialize(), writing a
# cache entry) in one process that had compiled every module's programs before, twice in CI and once here,
# at the same fixture, which passes in a fresh process. TEST_JOBS files at a time (tests/run_files.sh).
TEST_JOBS ?= 2
test: install
	@PYTHON=$(BIN)/python bash tests/run_files.sh $(TEST_JOBS)

# physics_impl=warp's tests need warp-lang (the warp extra: the warp-lang that mujoco-mjx 3.17's own warp extra
# pins), which dev leaves out because it slows every `import mujoco.mjx`. It goes into a folder of the venv that
# only these tests put on the path.
WARP_SITE := $(VENV)/warp-site
test-warp: install
	test -d $(WARP_SITE) || $(BIN)/python -m pip install --quiet --no-deps --target $(WARP_SITE) warp-lang==1.18.0
	PYTHONPATH=$(WARP_SITE) $(BIN)/python -m pytest tests -k "warp or physics_impl"

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
