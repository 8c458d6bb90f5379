#!/usr/bin/env bash
# The Python tests in the three environments at once, the live repeat test in a fourth process
# (their work is mostly waiting on subprocesses and servers that start, so they overlap well on
# two cores), each one's output
# printed whole when it ends, in this order; fails if any failed.
# Usage: scripts/pytest_envs.sh PYTHON PYTHON_VLLM033 PYTHON_SGLANG STEPSCOPE_CLI
set -uo pipefail
cd "$(dirname "$0")/.."
py=${1:?} py033=${2:?} pysgl=${3:?} cli=${4:?}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
"$py033" -m pytest -q --durations=8 -p no:cacheprovider tests/python \
  --ignore tests/python/test_vllm_live.py >"$logs/vllm033" 2>&1 &
p033=$!
STEPSCOPE_CLI=$cli "$pysgl" -m pytest -q --durations=4 -p no:cacheprovider tests/python/test_sglang.py \
  tests/python/test_sglang_differential.py \
  >"$logs/sglang" 2>&1 &
psgl=$!
# The live repeat test's server in a process of its own, beside the other live servers'.
"$py" -m pytest -q --durations=4 -p no:cacheprovider tests/python/test_vllm_live_repeat.py \
  >"$logs/repeat" 2>&1 &
prep=$!
echo "== pytest, vLLM 0.32 / torch 2.13 ($py)"
"$py" -m pytest -q --durations=8 tests/python --ignore tests/python/test_vllm_live_repeat.py
rc=$?
wait "$prep"; rcrep=$?
echo "== pytest, vLLM 0.32 / torch 2.13, the live repeat test ($py)"
cat "$logs/repeat"
wait "$p033"; rc033=$?
echo "== pytest, vLLM 0.33 / torch 2.14 ($py033)"
cat "$logs/vllm033"
wait "$psgl"; rcsgl=$?
echo "== pytest, SGLang 0.5.23 / torch 2.14.1 ($pysgl)"
cat "$logs/sglang"
[ "$rc" -eq 0 ] && [ "$rcrep" -eq 0 ] && [ "$rc033" -eq 0 ] && [ "$rcsgl" -eq 0 ]
