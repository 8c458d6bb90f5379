"""torch's own stop + export of the same workload as torch-engine/benches/stop.rs: N tensor
additions profiled on the CPU, then profiler.stop() and export_chrome_trace(".json.gz") —
what vLLM's TorchProfilerWrapper does on the engine thread. Prints one JSON line per size."""
import json
import os
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile


def measure(n: int) -> dict:
    x = torch.ones(4, 4)
    p = profile(activities=[ProfilerActivity.CPU], with_stack=False)
    p.start()
    for _ in range(n):
        x + x
    t0 = time.perf_counter()
    p.stop()
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.pt.trace.json.gz")
        p.export_chrome_trace(path)
        t2 = time.perf_counter()
        size = os.path.getsize(path)
    return {"ops": n, "stop_s": t1 - t0, "export_s": t2 - t1, "gz_bytes": size}


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps(measure(int(arg))), flush=True)
