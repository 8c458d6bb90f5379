"""A toy engine loop in Python profiled through stepscope's Python API (what the vLLM plugin
uses): a session armed with a delay, a few iterations captured by Kineto, stop() returning
while the trace is still being written, then the trace read back.

    .venv/bin/python examples/python_engine.py [OUT_DIR]
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

import torch

import stepscope

ITERATIONS = 10
CAPTURE_AFTER = 4  # delay_iterations: the 4th step after start() is the first captured
STOP_AFTER = 7  # the engine's control plane stops the session after this step


def batch(step: int) -> stepscope.Iteration:
    """Step 1 admits 4 prompts of 64 tokens; later steps decode them, with one more prompt
    every third step (a mixed batch)."""
    if step == 1:
        return stepscope.Iteration(num_ctx_reqs=4, num_ctx_tokens=256)
    if step % 3 == 0:
        return stepscope.Iteration(1, 64, 4, 4)
    return stepscope.Iteration(num_gen_reqs=4, num_gen_tokens=4)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out/python").resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "profiler": "torch",
        "torch_profiler_dir": str(out),
        "delay_iterations": CAPTURE_AFTER,
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,  # no vLLM API server here to profile
    }
    profiler = stepscope.WorkerProfiler(config, worker_name="py-engine-rank0")
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    print(f"python engine: {ITERATIONS} iterations, delay_iterations={CAPTURE_AFTER}, stop after step {STOP_AFTER}")

    profiler.start()
    stop_seconds = 0.0
    with torch.inference_mode():
        for step in range(1, ITERATIONS + 1):
            it = batch(step)
            profiler.step(it)
            mark = "captured" if profiler.is_running else "-"
            model(torch.randn(it.num_ctx_tokens + it.num_gen_tokens or 1, 256))
            profiler.step_end()
            print(f"  step {step:2}  {it.stage:7}  {it.name():40}  {mark}")
            if step == STOP_AFTER:
                began = time.perf_counter()
                profiler.stop()
                stop_seconds = time.perf_counter() - began
                print(f"  stop() returned in {stop_seconds * 1e3:.2f} ms; traces still being written: {profiler.pending_writes}")

    if not profiler.flush(timeout=120):
        print("python engine: the trace was not written within 120 s", file=sys.stderr)
        return 1
    manifest_path = max(out.glob("py-engine-rank0.*.stepscope.json"))
    manifest = json.loads(manifest_path.read_text())
    trace = out / manifest["trace_file"]
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    annotated = [e["name"] for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"]
    ops = sum(1 for e in events if e.get("cat") == "cpu_op")
    print(f"trace:    {trace} ({manifest['trace_bytes']} bytes, status {manifest['status']})")
    print(f"manifest: steps {manifest['first_step']}..{manifest['last_step']}, {manifest['iterations']} iterations, "
          f"written {manifest['writer_seconds']:.3f} s after stop()")
    print(f"in the trace: {len(annotated)} iterations, {ops} CPU ops")
    for name in annotated:
        print(f"  {name}")
    return 0 if manifest["status"] == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
