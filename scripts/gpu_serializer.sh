#!/usr/bin/env bash
# stepscope's serializer on a GPU machine (no Rust, no registry): run from the repository's root
# there with dist/*.whl carried along (`make wheel` here).
#
#   scripts/gpu_serializer.sh OUT_DIR
#
# Installs the wheel and builds its glue for the machine's torch (scripts/gpu_wheel.sh), runs
# scripts/gpu_serializer_check.py (stepscope's and Kineto's own writer on the same CUDA
# captures, OUT_DIR/serializer.jsonl), then the writer bench with both serializers
# (OUT_DIR/bench_writer.txt).
set -u
out=${1:?usage: scripts/gpu_serializer.sh OUT_DIR}
source "$(dirname "$0")/gpu_wheel.sh"
lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))')
echo "what libtorch exports of Kineto's logger registry and file logger:"
nm -DC "$lib" | grep -E "LoggerFactory|loggerFactory|ChromeTraceLogger::(ChromeTraceLogger|finalizeTrace)" | cut -c1-160
work=$(mktemp -d)
timeout 240 python3 scripts/gpu_serializer_check.py "$work" >"$out/serializer.log" 2>&1
rc=$?
grep '^{' "$out/serializer.log" >"$out/serializer.jsonl"
cut -c1-1500 "$out/serializer.jsonl"
[ $rc -eq 0 ] || tail -30 "$out/serializer.log"
timeout 200 python3 scripts/bench_writer.py --levels 1 --serializers stepscope,kineto --rounds 5 \
  >"$out/bench_writer.txt" 2>"$out/bench_writer.log"
echo "bench_writer exit status: $?"
cat "$out/bench_writer.txt"
exit $rc
