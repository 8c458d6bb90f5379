# `make demo` and `make test` each install what a fresh machine lacks (scripts/setup.sh,
# idempotent), then run. `.ci/run` calls `make test` and nothing else.
SHELL := /bin/bash
CARGO ?= cargo
# Debian packages a fresh machine needs: libclang-dev (nvtx-sys runs bindgen), valgrind and
# pkg-config (the C ABI tests), chromium (the HTML report test), g++ (the Kineto glue, the C++
# tests), libc6-dev (libc.a for the static stepscope command, `make cli-bin`).
PREFIX ?= /usr/local
DEBS := libclang-dev valgrind pkg-config chromium g++ libc6-dev
# The torch backend links the libtorch of the project's venv (made by scripts/setup.sh):
# torch-sys asks that venv's python where it is.
VENV := $(CURDIR)/.venv
export VIRTUAL_ENV := $(VENV)
export PATH := $(VENV)/bin:$(PATH)
export LIBTORCH_USE_PYTORCH := 1
# Debug builds as `make` runs them: no incremental state (nothing to reuse on a fresh machine,
# where it is pure cost) and line tables only as debug info (backtraces keep file and line).
# What each saved: docs/development.md, "What `make test` costs".
export CARGO_INCREMENTAL := 0
export CARGO_PROFILE_DEV_DEBUG := line-tables-only
# Build scripts and their dependencies with the same debug info as the rest. With cargo's
# default for them (none), clippy's check of the workspace and test-rust's build ran two
# torch-sys build scripts, each compiling libtch's C++ (over 2 minutes on a fresh machine): a
# dependency used both by a build script and by the code (libc, under `cc`) is built once, with
# the code's settings, in a build but not in a check, whose code gets metadata only; so `cc`,
# and the build script over it, were other units in each.
export CARGO_PROFILE_DEV_BUILD_OVERRIDE_DEBUG := line-tables-only

PYTHON := $(VENV)/bin/python
# vLLM 0.33 on torch 2.14 (scripts/setup.sh): the same wheel's tests under the next torch.
VENV033 := $(CURDIR)/.venv-vllm033
# SGLang 0.5.23 on torch 2.14.1 (scripts/setup.sh): the SGLang plugin's tests.
VENVSGL := $(CURDIR)/.venv-sglang
# torch 2.15.0 alone (scripts/setup.sh): the wheel's glue for it.
VENV215 := $(CURDIR)/.venv-torch215
UV := $(VENV)/bin/uv

.PHONY: all setup demo test fmt-check clippy test-rust header glue cli-bin cli-bin-path python wheel sdist test-python test-wheel test-sdist bench bench-vllm bench-sglang install clean gpu-prep

all: test

setup:
	@scripts/setup.sh $(DEBS)

# The main job as users meet it: a live `vllm serve` (vLLM's CPU build, a tiny model) with the
# plugin, /start_profile, requests, /stop_profile returning with the trace on disk while
# requests are served, then `stepscope analyze` of that directory. Then the toy engine's
# capture (NVTX and the CUDA profiler API), the torch backend on a libtorch toy engine, the
# same through the Python package, and a real GPU trace read back (bundled, from HTA's test
# set: no GPU here to make one).
demo: setup python
	$(PYTHON) scripts/demo_vllm.py out/vllm
	@echo
	@echo "== stepscope analyze out/vllm: the worker's and the API server's traces, from their manifests"
	$(CARGO) run --quiet --release -p stepscope-cli -- analyze --top 5 out/vllm
	@echo
	@echo "== each captured step against its floor: the model's shape and each step's work are in the traces; a CPU is not in the device table, so its peaks are measured now (scripts/cpu_peaks.py)"
	$(CARGO) run --quiet --release -p stepscope-cli -- analyze --top 0 $$($(PYTHON) scripts/cpu_peaks.py) out/vllm | sed -n '/each step against its floor/,/^$$/p'
	@echo
	$(CARGO) run --quiet --release --example engine
	@echo
	@echo "== the torch (Kineto) backend: a toy engine on libtorch, iterations 4-6 captured"
	$(CARGO) run --quiet --release -p stepscope-torch-engine -- out/torch
	@echo
	@echo "== the same from Python (the API the vLLM plugin uses): stop() returns, the trace follows"
	$(PYTHON) examples/python_engine.py out/python
	@echo
	@echo "== stepscope analyze out/torch: the torch capture, from the summary its writer put in the manifest"
	$(CARGO) run --quiet --release -p stepscope-cli -- analyze --top 5 out/torch
	@echo
	@echo "== stepscope analyze on a real GPU trace (cli/tests/data/hta, rank 0 of a 128-GPU job)"
	$(CARGO) run --quiet --release -p stepscope-cli -- analyze --top 5 \
		cli/tests/data/hta/trace_filter__sampled_rank-0.json.gz

# Each phase timed (scripts/phases.sh prints a line per phase at the end, also on a failure).
# `A|B` runs both at once: fmt-check beside clippy; test-sdist (its own target directory,
# target/sdist) beside test-rust, whose test binaries run one after another on one core for
# about 40 s of its 80 s warm (vmstat), and the release wheel's build (the glues, the command,
# the extension: its own target directories) with them, where it fills the cores the tests
# leave; test-python, which needs both cores throughout, then takes that wheel as it is
# (WHEEL_BUILT: no second pass over the builds, 18 s when nothing changed).
test:
	@WHEEL_BUILT=1 scripts/phases.sh setup 'fmt-check|clippy' 'test-rust|test-sdist|wheel' \
		test-python test-wheel
	@echo "make test: all checks passed"

# Formatting, and no import circle among the modules of one crate or of the Python package
# (the layers between crates are the compiler's to keep).
fmt-check:
	$(CARGO) fmt --all -- --check
	python3 scripts/check_imports.py

# Cargo unifies features across the packages of one invocation: a workspace-wide build turns
# on stepscope's `torch` feature (torch-engine asks for it; the Python extension for
# `torch-dynamic`, the glue loaded at run time). The library and its C ABI are checked as users
# build them by default (no libtorch), then with the glue loaded, then the rest with libtorch.
NO_TORCH := --exclude stepscope-torch-engine --exclude stepscope-python
clippy:
	$(CARGO) clippy --workspace --all-targets $(NO_TORCH) -- -D warnings
	$(CARGO) clippy -p stepscope --features torch-dynamic --all-targets -- -D warnings
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# stepscope's unit tests with libtorch linked and the torch engine's targets run from one
# invocation: each invocation resolves its build dependencies for its own set of packages, and
# two (`-p stepscope --features torch`, then `-p stepscope-torch-engine`) built torch-sys's C++
# twice on a fresh machine.
TORCH_TARGETS := -p stepscope -p stepscope-torch-engine --features stepscope/torch \
	--lib --bins --test kineto --bench stop
# The workspace's tests as test-rust builds them; test-python's `stepscope` command is the one
# this build makes (target/debug/stepscope), asked for with the same arguments: a build of only
# the command resolves features apart and compiled its dependencies again.
RUST_TESTS := --workspace --all-targets $(NO_TORCH)
# The workspace's tests include the C ABI's (crates/c: C and C++ programs against the cdylib,
# and include/stepscope.h against what cbindgen generates: a drift fails here).
test-rust:
	$(CARGO) test $(RUST_TESTS)
	$(CARGO) test --workspace --doc $(NO_TORCH)
	$(CARGO) test -p stepscope --features torch-dynamic --lib
	$(CARGO) test $(TORCH_TARGETS)

# include/stepscope.h generated from the C ABI's declarations (crates/c/src/lib.rs, cbindgen).
header:
	STEPSCOPE_BLESS_HEADER=1 $(CARGO) test --quiet -p stepscope-c --test header

# The Kineto glue for each torch minor version the environments hold (2.13, 2.14, 2.15), built
# under target/glue/ (when cpp/ changed, else nothing), then staged in the package
# (python/stepscope/_glue/, git-ignored) with its C++ sources: what the wheel carries and the
# torch backend loads, per torch minor version. The three build at once, each one g++ process
# (15-20 s of CPU): one after another they left a core idle (63 s, at once 23 s).
GLUE := target/glue
glue: setup
	scripts/at_once.sh "$(PYTHON) python/stepscope/glue.py build --src cpp --out $(GLUE)" \
		"$(VENV033)/bin/python python/stepscope/glue.py build --src cpp --out $(GLUE)" \
		"$(VENV215)/bin/python python/stepscope/glue.py build --src cpp --out $(GLUE)"
	rm -rf python/stepscope/_glue
	mkdir -p python/stepscope/_glue/src
	cp -p $(GLUE)/libstepscope_kineto-torch*.so python/stepscope/_glue/
	cp -p cpp/kineto.cc cpp/kineto_writer.h cpp/stepscope_kineto.h python/stepscope/_glue/src/

# The Python package (stepscope._native, which links no torch, the glue files, the vLLM
# plugin's entry points) installed into the venv in development mode: `.venv/bin/python -c
# "import stepscope"` works afterwards.
python: glue
	$(VENV)/bin/maturin develop --quiet

# The stepscope command for the wheel: a static executable (glibc linked in, `+crt-static`):
# nothing for a dynamic loader to load, resolve and relocate at each start (`stepscope analyze`
# of HTA's rank-1 trace: a median of 4.08 ms linked by zig, 3.46 ms static, docs/analyze.md),
# and nothing it needs of the system's libraries, so it runs wherever the manylinux_2_28 wheel
# installs. The wheel carries it as data: maturin takes `{module-name}.data/` (git-ignored) into
# the wheel when it is there, and the installer puts its scripts/ among the environment's, so
# `stepscope` on PATH is the executable itself, with no Python started first; `python -m stepscope` finds it through the
# package's RECORD (stepscope/_cli.py). A wheel built without it (an sdist's) has no command. It
# depends on the format crate only (no nvtx-sys, no bindgen), in a target directory of its own
# so that the two release builds never make each other rebuild what they share; `--target` keeps
# the static flag off build scripts and proc macros.
HOST := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
CLI_BIN := stepscope._native.data/scripts/stepscope
cli-bin: setup
	$(if $(HOST),,$(error cli-bin: `rustc -vV` names no host target: is rustc on PATH?))
	RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" $(CARGO) build --quiet --release -p stepscope-cli \
		--target $(HOST) --target-dir target/cli-build
	install -D -m 755 target/cli-build/$(HOST)/release/stepscope $(CLI_BIN)
	rm -rf python/stepscope/_bin

# The command's path once built, for the benches that time what the wheel ships.
cli-bin-path: cli-bin
	@echo $(CURDIR)/$(CLI_BIN)

# The release wheel under dist/: abi3, manylinux_2_28 (linked by zig against glibc 2.28, as
# torch's own wheels), optimized, with the Kineto glue for torch 2.13, 2.14 and 2.15 and the
# stepscope command. What the tests install, and what would be published.
# The extension links the library, whose nvtx-sys runs bindgen: for the target zig names, the
# host's C headers are named.
CLANG_INCLUDE = $(lastword $(wildcard /usr/lib/llvm-*/lib/clang/*/include))
ZIG_BINDGEN := BINDGEN_EXTRA_CLANG_ARGS="-isystem $(CLANG_INCLUDE) -isystem /usr/include/x86_64-linux-gnu -isystem /usr/include"
wheel: glue cli-bin
	rm -f dist/stepscope-*.whl
	$(ZIG_BINDGEN) $(VENV)/bin/maturin build --quiet --release --zig --out dist

# The source distribution: built with `pip install --no-build-isolation` where a torch is
# installed, it carries glue for that torch (bindings/python/build.rs).
sdist: setup
	$(VENV)/bin/maturin sdist --out dist

# The same wheel file installed (--no-deps) into the three environments: the Python API on the
# stub driver and real Kineto, the vLLM plugin on vLLM 0.32 (with the live `vllm serve` tests)
# and on vLLM 0.33's modules, the SGLang plugin on SGLang 0.5.23's modules (the built `stepscope`
# command merges for it); nine pytest processes at once, each live server's files in their own
# (scripts/pytest_envs.sh). ruff first: undefined names, unused imports, likely bugs; then
# mypy's stubtest: _native.pyi against the extension the wheel installed. Under `make test` the
# wheel was built in the phase before (WHEEL_BUILT), alone it is built first.
PY_SOURCES := python tests/python examples scripts/*.py
test-python: $(if $(WHEEL_BUILT),,wheel)
	$(VENV)/bin/ruff check --quiet --select F,E9,B $(PY_SOURCES)
	$(UV) pip install --quiet --python $(PYTHON) --no-deps --reinstall dist/stepscope-*.whl
	$(UV) pip install --quiet --python $(VENV033)/bin/python --no-deps --reinstall dist/stepscope-*.whl
	$(UV) pip install --quiet --python $(VENVSGL)/bin/python --no-deps --reinstall dist/stepscope-*.whl
	MYPY_CACHE_DIR=target/mypy-cache $(PYTHON) -m mypy.stubtest stepscope._native
	$(CARGO) test --quiet $(RUST_TESTS) --no-run
	scripts/pytest_envs.sh $(PYTHON) $(VENV033)/bin/python $(VENVSGL)/bin/python \
		$(CURDIR)/target/debug/stepscope

# The wheel as a package index and a user get it (scripts/check_wheel.sh): auditwheel's
# manylinux_2_28, an optimized extension, and in a fresh environment with torch 2.15 only (no
# Rust, no compiler) a Kineto capture from Python that the packaged stepscope command analyzes,
# and stepscope's serializer against Kineto's own writer under that torch.
# The wheel test-python built (`make wheel` first when run alone).
test-wheel: setup
	scripts/check_wheel.sh $(UV)

# The sdist built with --no-build-isolation where only torch 2.14 is installed: it carries glue
# for that torch and captures a trace (scripts/check_sdist.sh, a scratch venv, 1-3 min).
test-sdist: setup
	scripts/check_sdist.sh $(UV)

# What a GPU machine (CUDA and torch, no Rust, no registry) needs from here for
# scripts/gpu_run.sh: the wheel, the C library for the toy engine, the step bench's binary
# (carry dist/ and target/release/ there; docs/gpu.md).
gpu-prep: wheel
	$(CARGO) build --release -p stepscope-c
	$(CARGO) bench --bench step --no-run

# The benches that start torch captures load the Kineto glue from the package directory
# (`glue` stages it there: an editable install has no other on a fresh clone).
bench: glue
	$(CARGO) bench --workspace
	$(VENV)/bin/maturin develop --quiet --release
	$(PYTHON) scripts/bench_python_step.py

# vLLM's own torch profiler against stepscope's in live `vllm serve`s on this CPU: four server
# starts, three captures and stops on each (the table gives the median stop), 8-15 minutes.
# Prints the table docs/python.md quotes.
bench-vllm: glue
	$(VENV)/bin/maturin develop --quiet --release
	$(PYTHON) scripts/bench_vllm_live.py

# SGLang's own profiler against the stepscope plugin on SGLang's real profiler manager (CPU,
# Kineto): the scheduler's stop call and the time to the trace on disk, about 2 minutes.
bench-sglang: wheel
	$(UV) pip install --quiet --python $(VENVSGL)/bin/python --no-deps --reinstall dist/stepscope-*.whl
	$(VENVSGL)/bin/python -W ignore scripts/bench_sglang_stop.py

# The C/C++ library, headers and pkg-config file under $(PREFIX).
install:
	$(CARGO) build --release -p stepscope-c
	scripts/install.sh $(PREFIX) target/release

clean:
	$(CARGO) clean
