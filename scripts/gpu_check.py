"""stepscope against a real CUDA driver and Kineto's CUDA activity (CUPTI): run on a GPU machine
with the wheel installed. Prints one JSON object per check; exit status 1 if any failed.

    python scripts/gpu_check.py OUT_DIR

1. The torch backend, default activities (CPU and CUDA when libtorch sees a device): a few
   iterations of matmuls on the GPU, a delay/max window; stop() timed; the trace read back: the
   kernels Kineto recorded (CUPTI), the iteration annotations, the manifest and op table.
2. torch.profiler's own stop + export of the same workload, for the write-speed ratio.
3. Request shares: four iterations naming their requests with each one's tokens and phase;
   the wheel's `stepscope analyze --requests` splits each iteration's CUPTI kernel time among
   its requests by tokens: the shares equal that split and sum to the kernel time.
4. The cuda backend (cuProfilerStart/Stop on the real driver) from Python: the session runs
   and stops without an error.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import stepscope

ITERS = 12
DELAY, MAX = 3, 5


def work(x: torch.Tensor) -> torch.Tensor:
    for _ in range(20):
        x = torch.relu(x @ x) / x.shape[0]
    return x


def engine(p: stepscope.WorkerProfiler, x: torch.Tensor) -> None:
    for i in range(1, ITERS + 1):
        p.step(stepscope.Iteration(i, 16 * i, 32, 32))
        x = work(x)
        torch.cuda.synchronize()
        p.step_end()


def torch_backend(out: Path) -> dict:
    d = out / "torch"
    p = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": str(d), "delay_iterations": DELAY,
         "max_iterations": MAX, "torch_profiler_with_stack": True},
        "gpu_rank0",
    )
    x = torch.randn(1024, 1024, device="cuda")
    work(x)
    torch.cuda.synchronize()
    p.start()
    engine(p, x)
    t0 = time.perf_counter()
    p.stop()  # the window already ended by itself; a no-op here
    stop_s = time.perf_counter() - t0
    ok_flush = p.flush(300)
    (manifest_path,) = d.glob("*.stepscope.json")
    manifest = json.loads(manifest_path.read_text())
    trace = d / manifest["trace_file"]
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    cats: dict[str, int] = {}
    for e in events:
        cats[e.get("cat", "?")] = cats.get(e.get("cat", "?"), 0) + 1
    kernels = [e for e in events if e.get("cat") == "kernel"]
    gpu_ann = sorted({e["name"] for e in events if e.get("cat") == "gpu_user_annotation"})
    cpu_ann = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    table = (d / "gpu_rank0.profiler_out.txt")
    return {
        "check": "torch backend, CUDA activity",
        "glue": stepscope.kineto_glue(),
        "flushed": ok_flush,
        "status": manifest["status"],
        "iterations": manifest["iterations"],
        "first_step": manifest["first_step"],
        "writer_seconds": manifest["writer_seconds"],
        "json_bytes": manifest["json_bytes"],
        "trace_bytes": manifest["trace_bytes"],
        "kernels": len(kernels),
        "kernel_names": sorted({k["name"] for k in kernels})[:3],
        "devices": sorted({k.get("args", {}).get("device") for k in kernels}, key=str),
        "cpu_annotations": cpu_ann,
        "gpu_annotations": gpu_ann,
        "categories": cats,
        "header_keys": sorted(k for k in doc if k != "traceEvents"),
        "op_table_head": table.read_text().splitlines()[:4] if table.exists() else None,
        "stop_s": stop_s,
        "ok": manifest["status"] == "complete" and len(kernels) > 0 and len(cpu_ann) == MAX,
    }


def stop_latency(out: Path) -> dict:
    """A manual stop in the middle of a capture: what the engine thread pays, and the time to
    the trace on disk; then torch.profiler's own stop + export of the same work."""
    d = out / "stop"
    x = torch.randn(1024, 1024, device="cuda")
    p = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": str(d), "torch_profiler_with_stack": True},
        "stop_rank0",
    )
    p.start()
    for _ in range(8):
        p.step(stepscope.Iteration(0, 0, 32, 32))
        x = work(x)
        p.step_end()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    p.stop()
    ours_stop = time.perf_counter() - t0
    p.flush(300)
    ours_disk = time.perf_counter() - t0
    (m,) = d.glob("*.stepscope.json")
    ours = json.loads(m.read_text())

    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        with_stack=True,
    )
    prof.start()
    for _ in range(8):
        with torch.profiler.record_function("iteration"):
            x = work(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    prof.stop()
    theirs_stop = time.perf_counter() - t0
    path = out / "torch_own.pt.trace.json.gz"
    prof.export_chrome_trace(str(path))
    theirs_disk = time.perf_counter() - t0
    return {
        "check": "stop latency and time to disk, 8 iterations x 20 matmuls, with_stack",
        "stepscope_stop_s": ours_stop,
        "stepscope_on_disk_s": ours_disk,
        "stepscope_json_bytes": ours["json_bytes"],
        "torch_stop_s": theirs_stop,
        "torch_stop_plus_export_s": theirs_disk,
        "torch_gz_bytes": path.stat().st_size,
        "stop_ratio": theirs_stop / max(ours_stop, 1e-9),
        "ok": ours["status"] == "complete",
    }


def cuda_backend() -> dict:
    p = stepscope.WorkerProfiler({"profiler": "cuda", "delay_iterations": 1, "max_iterations": 3}, "cuda0")
    x = torch.randn(512, 512, device="cuda")
    p.start()
    running = []
    for _ in range(6):
        p.step(stepscope.Iteration(0, 0, 8, 8))
        running.append(p.is_running)
        x = work(x)
        p.step_end()
    torch.cuda.synchronize()
    st = p.status()
    # With NVTX_INJECTION64_PATH at tests/doubles' recorder (nsys's place), what NVTX saw.
    log = os.environ.get("STEPSCOPE_DOUBLES_LOG")
    nvtx = []
    if log and os.path.exists(log):
        nvtx = [line.split("\t", 3)[2:] for line in Path(log).read_text().splitlines()
                if line.startswith("nvtx") and ("\tpush\t" in line or "\tmark\t" in line)]
    return {
        "nvtx_recorded": nvtx,
        "check": "cuda backend (cuProfilerStart/Stop, real driver)",
        "running_per_step": running,
        "phase": st["phase"],
        "iterations_captured": st["iterations_captured"],
        "last_error": st["last_error"],
        "ok": st["last_error"] is None and st["iterations_captured"] == 3,
    }


def request_shares(out: Path) -> dict:
    """Each request's share of the captured iterations' GPU kernel time, by its tokens, as
    `stepscope analyze --requests` (the wheel's own command) reads it from CUPTI's kernels."""
    d = out / "requests"
    p = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": str(d), "max_iterations": 4,
         "torch_profiler_with_stack": False, "stepscope": {"request_ids": True}},
        "req_rank0",
    )
    x = torch.randn(1024, 1024, device="cuda")
    work(x)
    torch.cuda.synchronize()
    # (ids, tokens, in prefill): a's and b's prompts, then c's beside their decodes.
    plan = [
        (["a", "b"], [96, 32], [True, True]),
        (["a", "b", "c"], [1, 1, 64], [False, False, True]),
        (["a", "b", "c"], [1, 1, 1], [False, False, False]),
        (["b", "c"], [1, 1], [False, False]),
    ]
    p.start()
    for ids, tokens, prefill in plan:
        ctx = [t for t, f in zip(tokens, prefill, strict=True) if f]
        gen = [t for t, f in zip(tokens, prefill, strict=True) if not f]
        p.step(stepscope.Iteration(len(ctx), sum(ctx), len(gen), sum(gen), request_ids=ids,
                                   request_tokens=tokens, request_prefill=prefill))
        x = work(x)
        torch.cuda.synchronize()
        p.step_end()
    p.stop()  # the window's 4 iterations are done; it would end at the next step()
    p.flush(300)
    (manifest_path,) = d.glob("*.stepscope.json")
    trace = d / json.loads(manifest_path.read_text())["trace_file"]
    from stepscope import _cli

    cli = _cli.executable()
    run = subprocess.run([cli, "analyze", "--json", "--requests=0", str(trace)],
                         capture_output=True, text=True, timeout=300, check=False)
    if run.returncode != 0:
        return {"check": "request shares", "ok": False, "error": run.stderr[-2000:]}
    doc = json.loads(run.stdout)
    steps = doc["traces"][0]["steps"]
    (listed,) = doc["requests"]
    got = {r["id"]: r["gpu_ms"] for r in listed["requests"]}
    # What each request's share should be: each iteration's kernel time split by tokens.
    want: dict[str, float] = {}
    for st in steps:
        total = sum(st["tokens"])
        for rid, t in zip(st["requests"], st["tokens"], strict=True):
            want[rid] = want.get(rid, 0.0) + st["kernel_us"] / 1e3 * t / total
    kernel_ms = sum(st["kernel_us"] for st in steps) / 1e3
    close = all(abs(got[k] - want[k]) <= 1e-6 * max(1.0, want[k]) for k in want)
    return {
        "check": "request shares of CUPTI kernel time (analyze --requests)",
        "cli": cli,
        "iterations": [(st["name"], st["kernel_count"], round(st["kernel_us"], 1)) for st in steps],
        "kernel_ms": kernel_ms,
        "gpu_ms_by_request": got,
        "sum_of_shares_ms": sum(got.values()),
        "ok": len(steps) == len(plan) and kernel_ms > 0 and close and set(got) == set(want)
        and abs(sum(got.values()) - kernel_ms) <= 1e-6 * kernel_ms,
    }


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                      "device": torch.cuda.get_device_name(0),
                      "stepscope": stepscope.__version__, "pid": os.getpid()}), flush=True)
    ok = True
    for check in (torch_backend, stop_latency, request_shares, cuda_backend):
        try:
            r = check(out) if check is not cuda_backend else check()
        except Exception as e:  # noqa: BLE001 - report and go on
            r = {"check": check.__name__, "ok": False, "error": f"{type(e).__name__}: {e}"}
        ok &= bool(r.get("ok"))
        print(json.dumps(r, default=str), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
