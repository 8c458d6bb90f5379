"""The capture budget, measured: a Python engine loop (torch backend, CPU activity, Python
stacks, 200 small matmuls an iteration) with a window that is never stopped, as a
/start_profile whose /stop_profile never comes. Three runs, each in its own process: the budget
off, `max_capture_mb: 300`, and the defaults (no stepscope key). Prints the process's growth
over time (the trace's write included), where each window ended, and what the write cost. The
run without a budget is ended once it has grown UNBOUNDED_CAP_MB, without writing its trace (it
would grow until the OOM killer ends it, and writing what it holds would take 10-80 times as
much again).

    .venv/bin/python scripts/bench_capture_budget.py [SECONDS]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

UNBOUNDED_CAP_MB = 2000

CHILD = r"""
import json, sys, time
import torch, stepscope
seconds, cap, stepscope_keys, out = float(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
cfg = {"profiler": "torch", "torch_profiler_dir": out, "torch_profiler_with_stack": True}
if stepscope_keys is not None:
    cfg["stepscope"] = stepscope_keys
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
p = stepscope.WorkerProfiler(cfg, "bench")
a = torch.ones(8, 8)
base, began, next_sample, cut_at = rss(), time.monotonic(), 0.0, None
p.start()
while (now := time.monotonic() - began) < seconds:
    p.step()
    if p.is_active:
        for _ in range(200):
            torch.mm(a, a)
    elif cut_at is None:
        cut_at = now
    p.step_end()
    if now >= next_sample:
        grew = rss() - base
        print(json.dumps({"t": round(now, 1), "grew_mb": round(grew), "active": p.is_active}), flush=True)
        next_sample += 0.5
        if grew > cap:
            print(json.dumps({"cut_at_s": None, "last_cut": None, "budget_mb": 0, "ended_at_cap": True}), flush=True)
            import os
            os._exit(0)
status = p.status()
# The writer's own memory: the process's peak while the last trace is written, against its
# size when the write began (the captured events are Kineto's until then).
import threading
at_stop, peak, done = rss(), [0.0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.02)
sampler = threading.Thread(target=sample)
sampler.start()
p.stop()
p.flush(600)
done.set()
sampler.join()
import glob
manifests = [json.load(open(m)) for m in glob.glob(out + "/*.stepscope.json")]
json_mb = sum(m.get("json_bytes") or 0 for m in manifests) / 2**20
# The cut window's trace is written while the loop goes on: its own writer time, from its manifest.
write_s = max((m.get("writer_seconds") or 0 for m in manifests), default=0.0)
print(json.dumps({"cut_at_s": cut_at, "last_cut": status["last_cut"], "budget_mb": status["max_capture_mb"],
                  "write_peak_over_stop_mb": round(peak[0] - at_stop), "peak_over_base_mb": round(peak[0] - base), "write_s": round(write_s, 1),
                  "json_mb": round(json_mb)}), flush=True)
"""


def run(label: str, keys: dict | None, seconds: float) -> tuple[list[dict], dict]:
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(seconds), str(UNBOUNDED_CAP_MB), json.dumps(keys), out],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return lines[:-1], lines[-1]


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    runs = [
        ("budget off", {"max_capture_mb": 0, "max_capture_s": 0}),
        ("max_capture_mb 300", {"max_capture_mb": 300}),
        ("defaults", None),
    ]
    results = {label: run(label, keys, seconds) for label, keys in runs}
    times = sorted({s["t"] for samples, _ in results.values() for s in samples})
    print(f"process growth (MB) over time, open-ended window, {seconds:.0f} s at most")
    print(f"{'t (s)':>6}" + "".join(f"{label:>22}" for label in results))
    for t in times[:: max(1, len(times) // 20)]:
        row = f"{t:>6.1f}"
        for samples, _ in results.values():
            s = next((s for s in samples if s["t"] == t), None)
            row += f"{'' if s is None else s['grew_mb']:>22}"
        print(row)
    for label, (samples, end) in results.items():
        peak = max((s["grew_mb"] for s in samples), default=0)
        if end.get("ended_at_cap"):
            last = samples[-1]
            print(f"{label:>20}: never cut; grew {last['grew_mb']} MB in {last['t']} s, ended there")
            continue
        cut = end["last_cut"]
        where = (
            f"cut by {cut['by']} at {end['cut_at_s']:.1f} s, grown {cut['grew_mb']:.1f} MB "
            f"(x{cut['expansion']} = {cut['projected_mb']:.0f} MB projected)"
            if cut
            else "never cut"
        )
        print(
            f"{label:>20}: budget {end['budget_mb']} MB, {where}; JSON written "
            f"{end['json_mb']} MB, on disk {end['write_s']} s after its stop; the process's peak growth: {peak} MB "
            f"while stepping, {end['peak_over_base_mb']} MB while writing"
        )


if __name__ == "__main__":
    main()
