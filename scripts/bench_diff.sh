#!/usr/bin/env bash
# Times `stepscope diff` against Holistic Trace Analysis 0.5.0's TraceDiff.compare_traces on the
# same pairs of traces, both as whole processes (interpreter start and imports included for
# HTA; best of 5 for stepscope, of 3 for HTA), and HTA's call alone too (its imports and
# interpreter left out, best of 3), which favours HTA. HTA compares every iteration of each
# trace (control_iteration/test_iteration: all), as `diff` does.
# HTA comes from the package registry in its own venv, .bench-venv/ (scripts/hta_venv.sh).
# Usage: scripts/bench_diff.sh [BEFORE AFTER ...]   (default: the rank pair of
# cli/tests/data/hta, and each shared trace over 10 MB of JSON against itself). Not part of
# `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/hta_venv.sh
if [ $# -eq 0 ]; then
  data=cli/tests/data/hta
  shared=../shared/traces/hta
  set -- "$data/trace_filter__sampled_rank-0.json.gz" "$data/trace_filter__sampled_rank-1.json.gz"
  for t in "$shared"/trace_diff__control__control.json.gz "$shared"/ns_resolution_trace__rank-0.*.json.gz; do
    [ -f "$t" ] && set -- "$@" "$t" "$t"
  done
fi
# The command the wheel ships (static, `make cli-bin`), as a user runs it.
bin=$(make -s --no-print-directory cli-bin-path)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '%-44s %8s %12s %9s %11s %9s %9s\n' "pair (before)" "JSON MB" "HTA process" "HTA call" "stepscope" "ratio" "ratio"
printf '%-44s %8s %12s %9s %11s %9s %9s\n' "" "(both)" "s" "s" "s" "process" "call"
i=0
while [ $# -ge 2 ]; do
  before=$1 after=$2
  shift 2
  i=$((i + 1))
  a="$dir/$i/before" b="$dir/$i/after"
  mkdir -p "$a" "$b"
  cp "$before" "$a/"
  cp "$after" "$b/"
  json=$(python3 -c "import gzip,sys; print(sum(len(gzip.open(p).read()) if p.endswith('.gz') else len(open(p,'rb').read()) for p in sys.argv[1:]))" "$before" "$after")
  ours=$(python3 - "$bin" "$a" "$b" <<'PY'
import subprocess, sys, time
b, x, y = sys.argv[1:]
t = []
for _ in range(5):
    s = time.perf_counter()
    subprocess.run([b, "diff", x, y, "--json"], check=True, stdout=subprocess.DEVNULL)
    t.append(time.perf_counter() - s)
print(min(t))
PY
)
  code='
import sys, time, logging, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from hta.trace_diff import TraceDiff, LabeledTrace
def run():
    c = LabeledTrace(label="control", trace_dir=sys.argv[1])
    t = LabeledTrace(label="test", trace_dir=sys.argv[2])
    TraceDiff.compare_traces(c, t, control_rank=c.ranks()[0], test_rank=t.ranks()[0],
                             control_iteration=c.iterations(), test_iteration=t.iterations())
if len(sys.argv) > 3:
    best = float("inf")
    for _ in range(3):
        s = time.perf_counter(); run(); best = min(best, time.perf_counter() - s)
    print(best)
else:
    run()
'
  hta_process=$(python3 - "$venv/bin/python" "$code" "$a" "$b" <<'PY'
import subprocess, sys, time
py, code, x, y = sys.argv[1:]
t = []
for _ in range(3):
    s = time.perf_counter()
    r = subprocess.run([py, "-c", code, x, y], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t.append(time.perf_counter() - s if r.returncode == 0 else float("nan"))
print(min(t))
PY
)
  hta_call=$("$venv/bin/python" -c "$code" "$a" "$b" call 2>/dev/null || echo nan)
  python3 - "$before" "$json" "$hta_process" "$hta_call" "$ours" <<'PY'
import sys
name, json, hp, hc, ours = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:])
print(f"{name.rsplit('/', 1)[-1][:44]:<44} {json / 1e6:8.1f} {hp:12.2f} {hc:9.2f} {ours:11.4f} {hp / ours:8.0f}x {hc / ours:8.0f}x")
PY
done
