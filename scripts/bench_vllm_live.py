"""vLLM's own torch profiler against stepscope's, in a live `vllm serve` on this machine.

A benchmark, not a test: it starts four servers of the tiny model (tests/python/live_vllm.py),
one per (profiler, ignore_frontend), each with vLLM's default torch profiler config otherwise
(Python stacks recorded), sends the same traffic to each, and prints one table:

- `/stop_profile` latency after a capture of 8 concurrent requests x 64 tokens: the median of
  `--stops` captures and stops per server (3), each given (one stop's time varies, vLLM's own
  most: 6.1 s and then 16.8 s in two stops of one server, the traces the same size);
- request latency while profiling, against the same traffic unprofiled;
- the engine stall at the automatic stop: one request of 64 tokens whose decode crosses
  `max_iterations` (vLLM's own profiler stops and exports on the engine thread there), against
  the same request unprofiled;
- how long until the worker's trace is on disk after the stop, and its JSON size and MB/s
  (both stops return once the trace is on disk: vLLM's has exported it on the engine thread,
  stepscope's has waited for its writer, the engine serving on; the script checks the manifest
  says `complete` at once);
- short requests sent one after another while `/stop_profile` waits, against the same
  requests unprofiled: what a stop costs the traffic it overlaps.

Usage: .venv/bin/python scripts/bench_vllm_live.py [--tokens 64] [--requests 8] [--json OUT]
       [--stops 3] [--without-stack]
Needs the release build of the extension for representative writer figures (`make bench`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from live_vllm import VllmServer, cpu_build_missing  # noqa: E402


#: Tokens of the short requests sent while a stop waits.
SHORT_TOKENS = 8


def say(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def json_size(path: Path) -> int:
    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n


def worker_traces(traces: Path) -> set[Path]:
    return {p for p in traces.glob("rank0.*.pt.trace.json.gz")}


def wait_manifest(traces: Path, known: set[str], timeout: float = 900) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in traces.glob("rank0.*.stepscope.json"):
            if path.name in known:
                continue
            m = json.loads(path.read_text())
            if m["status"] != "writing":
                known.add(path.name)
                return m
        time.sleep(0.05)
    raise TimeoutError("no stepscope manifest completed")


def capture_and_stop(srv: VllmServer, kind: str, traces: Path, known: set[str],
                     args: argparse.Namespace) -> tuple[dict, list[float]]:
    """One capture of the bench's traffic, then `/stop_profile` with short requests sent one
    after another while it waits: what it took (with stepscope, the manifest's split), and the
    captured requests' latencies."""
    before = worker_traces(traces)
    assert srv.post("/start_profile")[0] == 200, srv.log_tail()
    profiled = srv.complete(args.requests, args.tokens)
    stop_done = threading.Event()
    during: list[float] = []

    def overlap() -> None:
        while not stop_done.is_set():
            during.append(srv.completion(8, SHORT_TOKENS, seed=len(during))[1])

    t = threading.Thread(target=overlap)
    t.start()
    status, _, stop_s = srv.post("/stop_profile")
    stop_done.set()
    t.join()
    assert status == 200, srv.log_tail()
    (trace,) = worker_traces(traces) - before  # on disk when the stop returned
    out = dict(
        stop_profile_s=stop_s,
        trace_on_disk_s=stop_s,
        trace_json_mb=json_size(trace) / 1e6,
        trace_gz_mb=trace.stat().st_size / 1e6,
        short_during_stop=during,
    )
    if kind != "vllm":
        (mpath,) = [p for p in traces.glob("rank0.*.stepscope.json")
                    if p.name.startswith(trace.name.split(".pt.trace")[0])]
        m = json.loads(mpath.read_text())
        assert m["status"] == "complete", m
        known.add(mpath.name)
        out.update(finalize_s=m["finalize_seconds"], write_s=m["write_seconds"],
                   writer_s=m["writer_seconds"], op_table_s=m.get("op_table_seconds") or 0.0,
                   op_table_wait_s=m.get("op_table_wait_seconds") or 0.0,
                   free_cpu_s=m.get("free_seconds") or 0.0)
    say(f"   capture: stop_profile {stop_s:.3f} s with the trace on disk "
        f"({out['trace_json_mb']:.0f} MB of JSON); {len(during)} short request(s) sent during it")
    return out, profiled


def run_one(kind: str, ignore_frontend: bool, args: argparse.Namespace, root: Path) -> dict:
    work = root / f"{kind}-{'ignore' if ignore_frontend else 'frontend'}"
    traces = work / "traces"
    env = {"STEPSCOPE_VLLM": "0"} if kind == "vllm" else {}
    config = {"profiler": "torch", "torch_profiler_dir": str(traces), "ignore_frontend": ignore_frontend}
    if args.without_stack:
        config["torch_profiler_with_stack"] = False
    srv = VllmServer(work, config, env=env)
    say(f"== {kind}, ignore_frontend={ignore_frontend}: starting vllm serve")
    began = time.monotonic()
    srv.start()
    say(f"   ready in {time.monotonic() - began:.0f} s")
    out: dict = {"profiler": kind, "ignore_frontend": ignore_frontend}
    try:
        srv.complete(args.requests, args.tokens)  # warm-up
        base = srv.complete(args.requests, args.tokens)
        single = [srv.complete(1, args.tokens)[0] for _ in range(3)]

        short = [srv.completion(8, SHORT_TOKENS, seed=i)[1] for i in range(5)]

        # Captures of the same traffic, each then /stop_profile with short requests sent one
        # after another while it waits: several, since one stop's time varies (vLLM's own took
        # 6.1 s and then 16.8 s in two stops of one server, for traces of the same size).
        known: set[str] = set()
        captured = [capture_and_stop(srv, kind, traces, known, args) for _ in range(args.stops)]
        stops = [c[0] for c in captured]
        # The median stop stands for the server (the lower of the two middle ones for an even
        # count); every stop is kept in `stops`.
        out.update(sorted(stops, key=lambda x: x["stop_profile_s"])[(len(stops) - 1) // 2])
        out.update(
            stops=stops,
            latency_base_median_s=statistics.median(base),
            latency_profiled_median_s=statistics.median(s for c in captured for s in c[1]),
            short_base_median_s=statistics.median(short),
            short_during_stop=[s for x in stops for s in x["short_during_stop"]],
        )

        # One request crossing the automatic stop of an 8-iteration window.
        time.sleep(1 if kind == "vllm" else 0)
        if kind != "vllm":
            # The previous trace is being written in the background; let it finish so the
            # two runs stall on the same thing (the automatic stop), not on a leftover write.
            deadline = time.monotonic() + 600
            while srv.get("/health")[0] == 200 and time.monotonic() < deadline:
                if all(
                    json.loads(p.read_text())["status"] != "writing"
                    for p in traces.glob("*.stepscope.json")
                ):
                    break
                time.sleep(0.2)
        assert srv.post("/start_profile", {"max_iterations": 8})[0] == 200
        crossing = srv.complete(1, args.tokens)[0]
        srv.post("/stop_profile")
        out.update(
            single_base_median_s=statistics.median(single),
            single_crossing_autostop_s=crossing,
        )
        say(f"   auto-stop: request {crossing:.3f} s vs {statistics.median(single):.3f} s unprofiled")
        if kind != "vllm":
            wait_manifest(traces, known)
    finally:
        say("   stopping the server")
        srv.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per request (default 64)")
    ap.add_argument("--requests", type=int, default=8, help="concurrent requests (default 8)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--stops", type=int, default=3,
                    help="captures and stops per server (default 3): the table gives the median "
                    "stop (and the range), since one stop's time varies, vLLM's own most")
    ap.add_argument("--without-stack", action="store_true",
                    help="both profilers with torch_profiler_with_stack=false (vLLM's default is "
                    "true): what the stops cost without torch's Python tracer, whose frames are "
                    "most of a default capture")
    args = ap.parse_args()
    if args.stops < 1:
        ap.error("--stops: at least 1")
    if reason := cpu_build_missing():
        say(f"cannot run: {reason}")
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-vllm-") as tmp:
        for ignore_frontend in (True, False):
            for kind in ("vllm", "stepscope"):
                results.append(run_one(kind, ignore_frontend, args, Path(tmp)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))

    by = {(r["profiler"], r["ignore_frontend"]): r for r in results}
    config = ("vLLM's default torch profiler config but torch_profiler_with_stack=false"
              if args.without_stack else "vLLM's default torch profiler config (with_stack)")
    print(f"\n{args.requests} concurrent requests x {args.tokens} tokens, {config}, one machine, "
          f"one run, {args.stops} capture(s) and stop(s) per server (one server per column and "
          "row; the rows below the first two give the median stop's figures)\n")
    print("| | vLLM's own | stepscope | ratio |")
    print("|---|---|---|---|")

    def stop_cell(r: dict) -> str:
        times = sorted(x["stop_profile_s"] for x in r["stops"])
        if len(times) == 1:
            return f"{r['stop_profile_s']:.3f} s"
        each = ", ".join(f"{t:.3f}" for t in times)
        which = "median" if len(times) % 2 else "lower middle"
        return f"{r['stop_profile_s']:.3f} s ({which} of {len(times)}: {each} s)"

    for ign in (True, False):
        v, s = by[("vllm", ign)], by[("stepscope", ign)]
        print(f"| `/stop_profile` (returns with the trace on disk), "
              f"ignore_frontend={str(ign).lower()} | {stop_cell(v)} "
              f"| {stop_cell(s)} | {v['stop_profile_s'] / s['stop_profile_s']:.0f}x |")
    for ign in (True, False):
        v, s = by[("vllm", ign)], by[("stepscope", ign)]
        cells = []
        for r in (v, s):
            d = r["short_during_stop"]
            cells.append(f"{len(d)} sent, median {statistics.median(d):.3f} s, max {max(d):.3f} s"
                         f" ({statistics.median(d) / r['short_base_median_s']:.1f}x unprofiled "
                         f"{r['short_base_median_s']:.3f} s)")
        print(f"| {SHORT_TOKENS}-token requests sent one after another during the "
              f"{len(v['stops'])} `/stop_profile`s, "
              f"ignore_frontend={str(ign).lower()} | {cells[0]} | {cells[1]} | |")
    for ign in (True, False):
        v, s = by[("vllm", ign)], by[("stepscope", ign)]
        print(f"| request crossing the auto-stop (unprofiled: {v['single_base_median_s']:.3f} / "
              f"{s['single_base_median_s']:.3f} s), ignore_frontend={str(ign).lower()} "
              f"| {v['single_crossing_autostop_s']:.3f} s | {s['single_crossing_autostop_s']:.3f} s "
              f"| {v['single_crossing_autostop_s'] / s['single_crossing_autostop_s']:.1f}x |")
    for ign in (True, False):
        v, s = by[("vllm", ign)], by[("stepscope", ign)]
        print(f"| median request latency while profiling (unprofiled: {v['latency_base_median_s']:.3f} / "
              f"{s['latency_base_median_s']:.3f} s), ignore_frontend={str(ign).lower()} "
              f"| {v['latency_profiled_median_s']:.3f} s | {s['latency_profiled_median_s']:.3f} s | |")
    for ign in (True, False):
        v, s = by[("vllm", ign)], by[("stepscope", ign)]
        vr = v["trace_json_mb"] / v["trace_on_disk_s"]
        print(f"| worker trace written, ignore_frontend={str(ign).lower()} "
              f"| {v['trace_on_disk_s']:.2f} s ({v['trace_json_mb']:.0f} MB JSON, {vr:.1f} MB/s, "
              f"{v['trace_gz_mb']:.1f} MB gz) | {s['writer_s']:.2f} s from the stop to the "
              f"rename ({s['trace_json_mb']:.0f} MB JSON, {s['trace_json_mb'] / s['writer_s']:.1f} "
              f"MB/s, {s['trace_gz_mb']:.1f} MB gz; finalize {s['finalize_s']:.2f} s; the "
              f"op table {s['op_table_s']:.2f} s beside the write, waited for "
              f"{s['op_table_wait_s']:.2f} s after the rename; then the free "
              f"{s['free_cpu_s']:.2f} s of CPU) "
              f"| {v['trace_on_disk_s'] / s['writer_s']:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
