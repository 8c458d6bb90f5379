#!/usr/bin/env bash
# Times `stepscope analyze` against Holistic Trace Analysis 0.5.0 on the same traces, one row
# per trace, and prints the ratios. stepscope is timed as a whole process (start, gunzip, parse,
# analysis, JSON out; best of 8). HTA (TraceAnalysis + get_gpu_kernel_breakdown) twice: as a
# whole process too, as a user runs it (interpreter start and imports included, best of 3), and
# in-process, its import and interpreter start left out (best of 3, one after another in one
# process), which favours HTA. stepscope's runs are taken four just before HTA's in-process runs
# and four just after, so that both bests come from the same stretch of the machine's time;
# that round is run BENCH_HTA_ROUNDS times (default 5) in the same HTA process, and the
# in-process ratio printed is the median of the rounds' ratios, with their range: on a VM whose
# two vCPUs ran at different speeds (a thread took 2.7 ms on one and 6 ms on the other), one
# round's ratio is a draw of where each side's threads landed. The time columns are the bests
# over all rounds; a round in which every HTA run failed counts for no ratio.
# HTA comes from the package registry in its own venv, .bench-venv/ (scripts/hta_venv.sh).
# Usage: scripts/bench_hta.sh [TRACE.json.gz ...]   (default: every trace of ../shared/traces/hta
# with over 1 MB of JSON, else those of cli/tests/data/hta). Not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${BENCH_HTA_ROUNDS:-5}
. scripts/hta_venv.sh
defaults=""
if [ $# -eq 0 ]; then
  shared=../shared/traces/hta
  [ -d "$shared" ] || shared=cli/tests/data/hta
  set -- "$shared"/*.json.gz
  defaults=1
fi
# The command the wheel ships (static, `make cli-bin`), as a user runs it.
bin=$(make -s --no-print-directory cli-bin-path)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '%-58s %7s %12s %9s %11s %9s %9s %13s\n' trace "JSON MB" "HTA process" "HTA call" "stepscope" "ratio" "ratio" "call ratio"
printf '%-58s %7s %12s %9s %11s %9s %9s %13s\n' "" "" "s" "s" "s" "process" "call" "rounds' range"
for trace in "$@"; do
  json=$(python3 -c "import gzip,sys; p=sys.argv[1]; print(len(gzip.open(p).read()) if p.endswith('.gz') else len(open(p,'rb').read()))" "$trace")
  if [ -n "$defaults" ] && [ "$json" -le 1000000 ]; then
    continue  # of the default set, only traces over 1 MB of JSON
  fi
  d="$dir/$(basename "$trace" .json.gz)"
  mkdir -p "$d"
  cp "$trace" "$d/"
  # HTA as a user runs it: a whole process each time.
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
  # stepscope's runs around HTA's in-process runs: on a shared VM whose speed drifts, a best of
  # each taken a minute apart compared two machines. HTA runs in one process of its venv,
  # imported once; stepscope from this plain interpreter (forking from one that has pandas
  # loaded would charge HTA's process size to stepscope).
  read -r ours hta median_call low_call high_call < <(python3 - "$bin" "$venv/bin/python" "$d" "$rounds" <<'PY'
import statistics, subprocess, sys, time
b, py, d, rounds = sys.argv[1:]
server = (
    "import sys, time, logging, warnings\n"
    "warnings.filterwarnings('ignore'); logging.disable(logging.WARNING)\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "for _ in sys.stdin:\n"
    "    s = time.perf_counter()\n"
    "    TraceAnalysis(trace_dir=sys.argv[1]).get_gpu_kernel_breakdown(visualize=False)\n"
    "    print(time.perf_counter() - s, flush=True)\n"
)
hta = subprocess.Popen([py, "-c", server, d], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
def run_ours(n):
    t = []
    for _ in range(n):
        s = time.perf_counter()
        subprocess.run([b, "analyze", "--json", "--from-traces", d], check=True,
                       stdout=subprocess.DEVNULL)
        t.append(time.perf_counter() - s)
    return t
bests = []  # per round: (stepscope's best, HTA's best)
for _ in range(int(rounds)):
    ours = run_ours(4)
    theirs = []
    for _ in range(3):
        hta.stdin.write("run\n")
        hta.stdin.flush()
        line = hta.stdout.readline()
        theirs.append(float(line) if line.strip() else float("nan"))
    ours += run_ours(4)
    bests.append((min(ours), min((t for t in theirs if t == t), default=float("nan"))))
hta.stdin.close()
hta.wait()
ours_best = min(o for o, _ in bests)
bests = [(o, h) for o, h in bests if h == h]  # NaN: HTA failed every run of that round
ratios = [h / o for o, h in bests]
if ratios:
    print(ours_best, min(h for _, h in bests), statistics.median(ratios), min(ratios), max(ratios))
else:
    print(ours_best, "nan nan nan nan")
PY
)
  ours=${ours:-nan}
  python3 - "$(basename "$trace")" "$json" "${hta_process:-nan}" "${hta:-nan}" "$ours" \
    "${median_call:-nan}" "${low_call:-nan}" "${high_call:-nan}" <<'PY'
import math, sys
name, json = sys.argv[1], int(sys.argv[2])
process, call, ours, median, low, high = (float(x) for x in sys.argv[3:])
ratio = lambda h: "failed" if math.isnan(h) else f"{h / ours:.1f}x"
spread = "failed" if math.isnan(median) else f"{low:.1f}-{high:.1f}x"
print(f"{name[:58]:58s} {json / 1e6:7.1f} {process:12.3f} {call:9.3f} {ours:11.4f} {ratio(process):>9s} "
      f"{'failed' if math.isnan(median) else f'{median:.1f}x':>9s} {spread:>13s}")
PY
  rm -rf "$d"
done
