# `make demo` and `make test` each install what a fresh machine lacks (scripts/setup.sh,
# idempotent), then run. `.ci/run` calls `make test` and nothing else.
SHELL := /bin/bash
CARGO ?= cargo
# Debian packages a fresh machine needs: libclang-dev (nvtx-sys runs bindgen), valgrind and
# pkg-config (the C ABI tests), chromium (the HTML report test).
PREFIX ?= /usr/local
DEBS := libclang-dev valgrind pkg-config chromium

.PHONY: all setup demo test fmt-check clippy test-rust bench install clean

all: test

setup:
	@scripts/setup.sh $(DEBS)

# The toy engine's capture, then reading a real GPU trace back (bundled, from HTA's test set:
# the engine cannot write Kineto traces until the torch backend exists).
demo: setup
	$(CARGO) run --quiet --release --example engine
	@echo
	@echo "== stepscope analyze on a real GPU trace (cli/tests/data/hta, rank 0 of a 128-GPU job)"
	$(CARGO) run --quiet --release -p stepscope-cli -- analyze --top 5 \
		cli/tests/data/hta/trace_filter__sampled_rank-0.json.gz

test: setup fmt-check clippy test-rust
	@echo "make test: all checks passed"

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust:
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc

bench: setup
	$(CARGO) bench --workspace

# The C/C++ library, headers and pkg-config file under $(PREFIX).
install:
	$(CARGO) build --release
	scripts/install.sh $(PREFIX) target/release

clean:
	$(CARGO) clean
