#!/usr/bin/env bash
# The Python tests in the three environments, as nine pytest processes at once: each live vLLM
# server's test files in a process of their own (a server start is mostly three processes
# importing vLLM, and the three starts overlap), the vLLM plugin's tests under vLLM 0.32 and
# under 0.33, the rest of each, SGLang's. On two cores one process after another leaves a core idle while a server imports;
# at once, the run is as long as its longest process. Each process's output is printed whole as
# it ends (a line says which, its status and its time); fails if any failed.
# Usage: scripts/pytest_envs.sh PYTHON PYTHON_VLLM033 PYTHON_SGLANG STEPSCOPE_CLI
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/as_they_end.sh
py=${1:?} py033=${2:?} pysgl=${3:?} cli=${4:?}
# vLLM imports humming (its quantized kernels), which starts two Python processes at each import
# to build CUDA helpers in the background: without CUDA they only load the machine (seen running
# 7 minutes each beside the tests). Every test process, and what it starts, goes without.
export HUMMING_DISABLE_PARALLEL_BUILD=1
# Python writes the bytecode of what it imports (machines of this kind set
# PYTHONDONTWRITEBYTECODE): setup wrote that of each environment's entry points only
# (scripts/warm_bytecode.py), and a module they do not load is then compiled once, by the first
# test process (or server it starts) that imports it, not by every one.
unset PYTHONDONTWRITEBYTECODE
logs=$(mktemp -d)
pids=()
names=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$logs"' EXIT

# run NAME PYTHON PYTEST-ARGS...: one pytest process in the background, its output in a log,
# which ends with the CPU time the process used, with the servers and children it waited for
# (where make test's two cores go): `times`' second line, in a shell around it that passes a
# TERM on.
run() {
  local name=$1 python=$2
  shift 2
  (
    "$python" -m pytest -q --durations=5 -p no:cacheprovider "$@" &
    child=$!
    trap 'kill "$child" 2>/dev/null' TERM
    wait "$child"
    rc=$?
    echo "CPU time, user and system: this shell's, then pytest's with what it waited for:"
    times
    exit "$rc"
  ) >"$logs/${#names[@]}" 2>&1 &
  pids+=($!)
  names+=("$name")
}

live=tests/python/test_vllm_live
run "vLLM 0.32 / torch 2.13, live: windows, stops, the timeline ($py)" "$py" "$live.py"
# The slow-step trigger's test and the request-log ring's share one server (conftest's
# slow_step_live).
run "vLLM 0.32 / torch 2.13, live: the slow-step trigger, a request-log ring smaller than the requests, then diff ($py)" \
  "$py" "${live}_trigger.py" "${live}_ring.py" "${live}_diff.py"
# The request-log and request-span tests share one server (conftest's token_cost_live), the
# spans' last (a silent collector).
run "vLLM 0.32 / torch 2.13, live: a repeat series, then request lifecycles and spans ($py)" \
  "$py" "${live}_repeat.py" "${live}_requests.py" "${live}_otel.py"
run "vLLM 0.32 / torch 2.13, live: verl's rollout server and its stops ($py)" "$py" "${live}_verl.py"
# The rest, the plugin's tests apart: as one process each (vLLM 0.32's and 0.33's) they ended
# last. The machine is busy throughout (docs/development.md: the CPU times these logs end with
# leave out processes their parents did not wait for; vmstat shows both cores busy), so a split
# only evens out where the processes end.
plugin=tests/python/test_vllm_plugin.py
run "vLLM 0.32 / torch 2.13, the plugin ($py)" "$py" "$plugin"
run "vLLM 0.32 / torch 2.13 ($py)" "$py" tests/python \
  --ignore "$live.py" --ignore "${live}_trigger.py" --ignore "${live}_repeat.py" \
  --ignore "${live}_verl.py" --ignore "${live}_diff.py" --ignore "${live}_requests.py" \
  --ignore "${live}_otel.py" --ignore "${live}_ring.py" --ignore "$plugin"
run "vLLM 0.33 / torch 2.14, the plugin ($py033)" "$py033" "$plugin"
run "vLLM 0.33 / torch 2.14 ($py033)" "$py033" tests/python --ignore "$live.py" --ignore "$plugin"
STEPSCOPE_CLI=$cli run "SGLang 0.5.23 / torch 2.14.1 ($pysgl)" "$pysgl" \
  tests/python/test_sglang.py tests/python/test_sglang_differential.py \
  tests/python/test_sglang_otel.py

echo "== ${#pids[@]} pytest processes at once; each one's output follows as it ends"
began=$SECONDS
failed=0
# ended INDEX STATUS: one pytest process ended.
ended() {
  local status=passed
  [ "$2" -eq 0 ] || { status="FAILED (exit $2)"; failed=1; }
  echo "== pytest, ${names[$1]}: $status after $((SECONDS - began)) s"
  cat "$logs/$1"
}
as_they_end ended "${pids[@]}"
pids=()
exit "$failed"
