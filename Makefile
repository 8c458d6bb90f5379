# `make demo` and `make test` each install what a fresh machine lacks (scripts/setup.sh,
# idempotent), then run. `.ci/run` calls `make test` and nothing else.
SHELL := /bin/bash
CARGO ?= cargo
# Debian packages a fresh machine needs: libclang-dev (nvtx-sys runs bindgen), valgrind and
# pkg-config (the C ABI tests), chromium (the HTML report test).
PREFIX ?= /usr/local
DEBS := libclang-dev valgrind pkg-config chromium
# The torch backend links the libtorch of the project's venv (made by scripts/setup.sh):
# torch-sys asks that venv's python where it is.
VENV := $(CURDIR)/.venv
export VIRTUAL_ENV := $(VENV)
export PATH := $(VENV)/bin:$(PATH)
export LIBTORCH_USE_PYTORCH := 1

PYTHON := $(VENV)/bin/python

.PHONY: all setup demo test fmt-check clippy test-rust python test-python bench bench-vllm install clean

all: test

setup:
	@scripts/setup.sh $(DEBS)

# The toy engine's capture (NVTX and the CUDA profiler API), the torch backend on a libtorch
# toy engine (a Kineto trace written off the engine thread), the same through the Python
# package, then reading a real GPU trace back (bundled, from HTA's test set: no GPU here to
# make one).
demo: setup python
	$(CARGO) run --quiet --release --example engine
	@echo
	@echo "== the torch (Kineto) backend: a toy engine on libtorch, iterations 4-6 captured"
	$(CARGO) run --quiet --release -p stepscope-torch-engine -- out/torch
	@echo
	@echo "== the same from Python (the API the vLLM plugin uses): stop() returns, the trace follows"
	$(PYTHON) examples/python_engine.py out/python
	@echo
	@echo "== stepscope analyze on a real GPU trace (cli/tests/data/hta, rank 0 of a 128-GPU job)"
	$(CARGO) run --quiet --release -p stepscope-cli -- analyze --top 5 \
		cli/tests/data/hta/trace_filter__sampled_rank-0.json.gz

test: setup fmt-check clippy test-rust test-python
	@echo "make test: all checks passed"

fmt-check:
	$(CARGO) fmt --all -- --check

# Cargo unifies features across the packages of one invocation: a workspace-wide build turns
# on stepscope's `torch` feature (torch-engine and the Python extension ask for it). The library
# and its C ABI are checked as users build them by default (no libtorch), then the rest with it.
NO_TORCH := --exclude stepscope-torch-engine --exclude stepscope-python
clippy:
	$(CARGO) clippy --workspace --all-targets $(NO_TORCH) -- -D warnings
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust:
	$(CARGO) test --workspace --all-targets $(NO_TORCH)
	$(CARGO) test --workspace --doc $(NO_TORCH)
	$(CARGO) test -p stepscope --features torch --lib
	$(CARGO) test -p stepscope-torch-engine --all-targets

# The Python package (stepscope._native built against the venv's torch, with the vLLM plugin's
# entry point) installed into the venv in development mode: `.venv/bin/python -c "import
# stepscope"` works afterwards.
python: setup
	$(VENV)/bin/maturin develop --quiet

# The Python API on the stub driver and real Kineto, and the vLLM plugin on the real vllm.
# ruff first: undefined names, unused imports, likely bugs (pyflakes and bugbear rules).
PY_SOURCES := python tests/python examples scripts/*.py
test-python: python
	$(VENV)/bin/ruff check --quiet --select F,E9,B $(PY_SOURCES)
	$(PYTHON) -m pytest -q tests/python

bench: setup
	$(CARGO) bench --workspace
	$(VENV)/bin/maturin develop --quiet --release
	$(PYTHON) scripts/bench_python_step.py

# vLLM's own torch profiler against stepscope's in live `vllm serve`s on this CPU: four server
# starts, about 15 minutes. Prints the table the README quotes.
bench-vllm: setup
	$(VENV)/bin/maturin develop --quiet --release
	$(PYTHON) scripts/bench_vllm_live.py

# The C/C++ library, headers and pkg-config file under $(PREFIX).
install:
	$(CARGO) build --release
	scripts/install.sh $(PREFIX) target/release

clean:
	$(CARGO) clean
