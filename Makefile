# `make demo` and `make test` each install what a fresh machine lacks (scripts/setup.sh,
# idempotent), then run. `.ci/run` calls `make test` and nothing else.
SHELL := /bin/bash
CARGO ?= cargo
# Debian packages the build needs on a fresh machine (libclang-dev: nvtx-sys runs bindgen).
DEBS := libclang-dev

.PHONY: all setup demo test fmt-check clippy test-rust bench clean

all: test

setup:
	@scripts/setup.sh $(DEBS)

demo: setup
	$(CARGO) run --quiet --release --example engine

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

clean:
	$(CARGO) clean
