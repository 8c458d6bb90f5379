"""What the request log costs vLLM's engine core per step, from Python, as its scheduler hooks
run it: one step of B requests in decode (`begin_step`, the scheduler output's requests, the
step's end and each request's token), on vLLM's own `SchedulerOutput` and `EngineCoreOutputs`
classes, for B = 1, 64 and 256. Beside it, in the same run: the step timeline's cost from
Python (`step(Iteration)` and `step_end()`, what the worker plugin runs per step with the
timeline on) and vLLM's own `compute_iteration_details` on the same output (which that path
calls). Per-request cost: the slope between B = 1 and 256. Then what a captured iteration
costs the worker plugin with `"request_ids": true`: its `Iteration` with the ids alone (before
each request's tokens and phase were recorded) and with them.

    .venv/bin/python scripts/bench_requests.py
"""

from __future__ import annotations

import time

import stepscope
from stepscope.vllm import lifecycles, worker


def per_call_us(fn, seconds: float = 1.0) -> float:
    """Median of 5 runs of ~seconds/5 each, µs per call."""
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t > 0.05:
            break
        n *= 2
    runs = []
    per_run = max(1, int(n * (seconds / 5) / 0.05))
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(per_run):
            fn()
        runs.append((time.perf_counter() - t) / per_run * 1e6)
    runs.sort()
    return runs[2]


def measure(batch: int) -> tuple[float, float, float, float, float]:
    """(log step, timeline step, compute_iteration_details, a captured iteration with ids,
    with ids, tokens and phases), µs, for a batch of `batch`."""
    from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.utils import compute_iteration_details

    ids = [f"cmpl-{i * 0x9E3779B97F4A7C15 % (1 << 128):032x}-0-{i:08x}" for i in range(batch)]
    log = stepscope.RequestLog()
    for i in ids:
        log.arrived(i, 100, time.time())
    step = log.begin_step()
    log.scheduled(step, ids, [100] * batch, [0] * batch)
    log.end_step(step)
    log.produced(step, ids, [1] * batch)
    # Each step decodes one more token: the engine has computed all but the last.
    computed = [100] * batch
    cached = CachedRequestData(
        req_ids=ids, resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
        new_block_ids=[None] * batch, num_computed_tokens=computed,
        num_output_tokens=[1] * batch,
    )  # fmt: skip
    out = SchedulerOutput(
        scheduled_new_reqs=[], scheduled_cached_reqs=cached,
        num_scheduled_tokens=dict.fromkeys(ids, 1), total_num_scheduled_tokens=batch,
        scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
        finished_req_ids=set(), free_encoder_mm_hashes=[], preempted_req_ids=set(),
    )  # fmt: skip
    outputs = {0: EngineCoreOutputs(outputs=[
        EngineCoreOutput(request_id=i, new_token_ids=[7]) for i in ids])}  # fmt: skip

    def log_step() -> None:
        s = log.begin_step(0)
        lifecycles._record_schedule(log, s, out)
        lifecycles._record_outputs(log, s, outputs)
        for k in range(batch):
            computed[k] += 1

    profiler = stepscope.WorkerProfiler({"stepscope": {"timeline": True}}, "bench")
    it = stepscope.Iteration(0, 0, batch, batch)

    def timeline_step() -> None:
        profiler.step(it)
        profiler.step_end()

    def with_ids() -> None:
        worker.iteration_of(out, compute_iteration_details, False, worker.request_ids_of(out))

    def with_shares() -> None:
        worker.iteration_of(out, compute_iteration_details, False, True)

    return (
        per_call_us(log_step),
        per_call_us(timeline_step),
        per_call_us(lambda: compute_iteration_details(out)),
        per_call_us(with_ids),
        per_call_us(with_shares),
    )


def main() -> None:
    print("B      log step (µs)  timeline step (µs)  compute_iteration_details (µs)")
    rows = {}
    for batch in (1, 64, 256):
        rows[batch] = measure(batch)
        print(f"{batch:<6} {rows[batch][0]:>13.2f}  {rows[batch][1]:>18.2f}  {rows[batch][2]:>30.2f}")
    slope = (rows[256][0] - rows[1][0]) / 255
    print(f"per request in the batch: {slope * 1e3:.0f} ns (log); "
          f"compute_iteration_details: {(rows[256][2] - rows[1][2]) / 255 * 1e3:.0f} ns")
    print("B      captured Iteration: ids (µs)  ids, tokens, phases (µs)")
    for batch, r in rows.items():
        print(f"{batch:<6} {r[3]:>27.2f}  {r[4]:>24.2f}")
    log = stepscope.RequestLog()
    print(f"memory at the default sizes (4096 requests, 4096 steps): {log.memory_bytes / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
