#!/usr/bin/env bash
# Times `stepscope analyze` against Holistic Trace Analysis 0.5.0 on the same traces, one row
# per trace, and prints the ratios. stepscope is timed as a whole process (start, gunzip, parse,
# analysis, JSON out; best of 7). HTA (TraceAnalysis + get_gpu_kernel_breakdown) twice: as a
# whole process too, as a user runs it (interpreter start and imports included, best of 3), and
# in-process, its import and interpreter start left out (best of 3), which favours HTA.
# HTA comes from the package registry in its own venv, .bench-venv/ (scripts/hta_venv.sh).
# Usage: scripts/bench_hta.sh [TRACE.json.gz ...]   (default: every trace of ../shared/traces/hta
# with over 1 MB of JSON, else those of cli/tests/data/hta). Not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/hta_venv.sh
defaults=""
if [ $# -eq 0 ]; then
  shared=../shared/traces/hta
  [ -d "$shared" ] || shared=cli/tests/data/hta
  set -- "$shared"/*.json.gz
  defaults=1
fi
cargo build -q --release -p stepscope-cli
bin=$PWD/target/release/stepscope
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '%-58s %7s %12s %9s %11s %9s %9s\n' trace "JSON MB" "HTA process" "HTA call" "stepscope" "ratio" "ratio"
printf '%-58s %7s %12s %9s %11s %9s %9s\n' "" "" "s" "s" "s" "process" "call"
for trace in "$@"; do
  json=$(python3 -c "import gzip,sys; p=sys.argv[1]; print(len(gzip.open(p).read()) if p.endswith('.gz') else len(open(p,'rb').read()))" "$trace")
  if [ -n "$defaults" ] && [ "$json" -le 1000000 ]; then
    continue  # of the default set, only traces over 1 MB of JSON
  fi
  d="$dir/$(basename "$trace" .json.gz)"
  mkdir -p "$d"
  cp "$trace" "$d/"
  # stepscope from a plain interpreter: forking from one that has pandas loaded would charge
  # HTA's process size to stepscope.
  ours=$(python3 - "$bin" "$d" <<'PY'
import subprocess, sys, time
b, d = sys.argv[1:]
t = []
for _ in range(7):
    s = time.perf_counter()
    subprocess.run([b, "analyze", "--json", "--from-traces", d], check=True, stdout=subprocess.DEVNULL)
    t.append(time.perf_counter() - s)
print(min(t))
PY
)
  hta_process=$(python3 - "$venv/bin/python" "$d" <<'PY'
import subprocess, sys, time
py, d = sys.argv[1:]
code = (
    "import sys, logging, warnings; warnings.filterwarnings('ignore'); logging.disable(logging.WARNING)\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "TraceAnalysis(trace_dir=sys.argv[1]).get_gpu_kernel_breakdown(visualize=False)"
)
t = []
for _ in range(3):
    s = time.perf_counter()
    r = subprocess.run([py, "-c", code, d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t.append(time.perf_counter() - s if r.returncode == 0 else float("nan"))
print(min(t))
PY
)
  hta=$("$venv/bin/python" - "$d" <<'PY'
import sys, time, logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
d = sys.argv[1]
t = []
for _ in range(3):
    s = time.perf_counter()
    TraceAnalysis(trace_dir=d).get_gpu_kernel_breakdown(visualize=False)
    t.append(time.perf_counter() - s)
print(min(t))
PY
) || hta=""
  python3 - "$(basename "$trace")" "$json" "${hta_process:-nan}" "${hta:-nan}" "$ours" <<'PY'
import math, sys
name, json = sys.argv[1], int(sys.argv[2])
process, call, ours = (float(x) for x in sys.argv[3:])
ratio = lambda h: "failed" if math.isnan(h) else f"{h / ours:.1f}x"
print(f"{name[:58]:58s} {json / 1e6:7.1f} {process:12.3f} {call:9.3f} {ours:11.4f} {ratio(process):>9s} {ratio(call):>9s}")
PY
  rm -rf "$d"
done
