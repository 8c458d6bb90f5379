#!/usr/bin/env bash
# Times `stepscope analyze` against Holistic Trace Analysis on the same trace and prints the
# ratio. HTA comes from PyPI (holistictraceanalysis) in its own venv, .bench-venv/ (made once).
# Usage: scripts/bench_hta.sh [TRACE.json.gz]   (default: the 35 MB training trace in
# cli/tests/data/hta). Not part of `make test`: it needs HTA and pandas installed.
set -euo pipefail
cd "$(dirname "$0")/.."
trace=${1:-cli/tests/data/hta/trace_diff__control__control.json.gz}
venv=.bench-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import hta" 2>/dev/null; then
  echo "bench: creating $venv with holistictraceanalysis (once)…" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check holistictraceanalysis
fi
cargo build -q --release -p stepscope-cli
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$trace" "$dir/"
json_mb=$(python3 -c "import gzip,sys; p=sys.argv[1]; print(len(gzip.open(p).read()) if p.endswith('.gz') else len(open(p,'rb').read()))" "$trace")
# stepscope is timed from a plain interpreter: forking from one that has pandas loaded would
# charge HTA's process size to stepscope.
ours=$(python3 - "$dir" <<'PY'
import subprocess, sys, time
d = sys.argv[1]
t = []
for _ in range(7):
    s = time.perf_counter()
    subprocess.run(["target/release/stepscope", "analyze", "--json", d], check=True, stdout=subprocess.DEVNULL)
    t.append(time.perf_counter() - s)
print(min(t))
PY
)
"$venv/bin/python" - "$dir" "$json_mb" "$ours" <<'PY'
import sys, time, logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
d, size, o = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def hta():
    a = TraceAnalysis(trace_dir=d)
    a.get_gpu_kernel_breakdown(visualize=False)

t = []
for _ in range(3):
    s = time.perf_counter(); hta(); t.append(time.perf_counter() - s)
h = min(t)
print(f"trace: {size/1e6:.1f} MB of JSON")
print(f"HTA TraceAnalysis + get_gpu_kernel_breakdown: {h:.3f} s (best of 3, in-process)")
print(f"stepscope analyze --json:                     {o:.3f} s (best of 7, whole process)")
print(f"ratio: stepscope is {h/o:.1f}x faster; {size/1e6/o:.0f} MB/s of JSON end to end")
PY
