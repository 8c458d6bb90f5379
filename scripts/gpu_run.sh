#!/usr/bin/env bash
# The whole GPU check on a GPU machine with no Rust and no package registry: run from the
# repository's root there, with what `make gpu-prep` built here carried along (dist/*.whl,
# target/release/libstepscope.so, the step bench's binary under target/release/deps/).
#
#   scripts/gpu_run.sh OUT_DIR
#
# Installs the wheel into a scratch directory, builds the Kineto glue for the machine's torch
# (python -m stepscope.glue build: $CXX, then g++), runs scripts/gpu_check.py (one JSON line per
# check into OUT_DIR/results.jsonl, its whole output into OUT_DIR/log.txt) and leaves the
# traces and the tools' reports in OUT_DIR/gpu_data.tar.gz.
set -u
out=${1:?usage: scripts/gpu_run.sh OUT_DIR}
source "$(dirname "$0")/gpu_wheel.sh"
work=$(mktemp -d)
timeout "${GPU_CHECK_TIMEOUT:-480}" python3 scripts/gpu_check.py "$work" >"$out/log.txt" 2>&1
rc=$?
grep '^{' "$out/log.txt" >"$out/results.jsonl"
cp "$work/gpu_data.tar.gz" "$out/" 2>/dev/null
cut -c1-700 "$out/results.jsonl"
echo "gpu_check exit status: $rc"
exit $rc
