"""What the SGLang plugin's request-log hooks cost the scheduler a step: ``run_batch`` and
``process_batch_result``'s hooks (stepscope.sglang.lifecycles) around stand-ins for SGLang's
own bodies, on a decode batch of B requests (SGLang's ForwardMode; requests with the fields
the hooks read), against the stand-ins alone. Median of 400 steps; run in the SGLang
environment::

    .venv-sglang/bin/python scripts/bench_sglang_requests.py
"""

import os
import statistics
import time
os.environ["STEPSCOPE_CONFIG"] = '{"stepscope": {"requests": true}}'
from types import SimpleNamespace
from sglang.srt.model_executor.forward_batch_info import ForwardMode
import stepscope.sglang.lifecycles as lc

class R:
    __slots__ = ("rid", "origin_input_ids", "output_ids", "finished_reason")
    def __init__(self, i):
        self.rid = f"req-{i:06d}-abcdef0123456789"
        self.origin_input_ids = [1] * 64
        self.output_ids = [7]
        self.finished_reason = None
    @property
    def seqlen(self):
        return len(self.origin_input_ids) + len(self.output_ids)
    def finished(self):
        return self.finished_reason is not None

def run(B, n=400):
    reqs = [R(i) for i in range(B)]
    sched = SimpleNamespace(waiting_queue=[])
    log = lc.request_log()
    for r in reqs:
        log.arrived(r.rid, 64)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, reqs=reqs, decoding_reqs=None)
    def forward(s, b): return None
    def result(s, b, res):
        for r in b.reqs:
            r.output_ids.append(7)
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        lc.around_run_batch(forward, sched, batch)
        lc.around_process_result(result, sched, batch, None)
        times.append(time.perf_counter_ns() - t)
    # the same step's own work without the log: the stand-ins alone
    base = []
    for _ in range(n):
        t = time.perf_counter_ns()
        forward(sched, batch); result(sched, batch, None)
        base.append(time.perf_counter_ns() - t)
    m, b0 = statistics.median(times) / 1e3, statistics.median(base) / 1e3
    print(f"B={B}: hooks+stand-ins {m:.1f} us, stand-ins alone {b0:.1f} us, log {m-b0:.1f} us a step, {(m-b0)*1e3/B:.0f} ns a request")

for B in (1, 32, 256):
    run(B)
