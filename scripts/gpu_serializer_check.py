"""stepscope's serializer against Kineto's own on CUDA captures (run by scripts/gpu_serializer.sh
on a GPU machine, with the wheel installed and its glue built for the machine's torch).

Each capture runs `stepscope.serializer: "compare"`, so Kineto's own writer writes the same
capture from the same save beside stepscope's: kernels, copies, sets, CUDA runtime calls and
their flows, CPU ops with shapes, Python frames. One JSON line per capture: whether the two
parsed traces hold the same header (but the file each names) and the same events, how many
events of each category each writer wrote, and the first differences if any.

    python3 scripts/gpu_serializer_check.py WORK_DIR
"""

from __future__ import annotations

import collections
import glob
import json
import sys
import time
from pathlib import Path

import kineto_compare
import torch

import stepscope


def workload(n: int) -> None:
    a = torch.randn(256, 256, device="cuda")
    host = torch.randn(256, 256).pin_memory()
    for _ in range(n):
        b = torch.mm(a, a).relu_()
        b.add_(host.to("cuda", non_blocking=True))
        torch.zeros(1024, device="cuda")
        _ = b.sum().item()


def capture(out: Path, stack: bool, steps: int) -> dict:
    cfg = {
        "profiler": "torch",
        "torch_profiler_dir": str(out),
        "torch_profiler_with_stack": stack,
        "torch_profiler_record_shapes": True,
        "torch_profiler_use_gzip": False,
        "stepscope": {"serializer": "compare"},
    }
    p = stepscope.WorkerProfiler(cfg, "gpu")
    p.start()
    for _ in range(steps):
        p.step()
        workload(20)
        p.step_end()
    p.stop()
    ok = p.flush(300)
    p.shutdown()
    (manifest,) = [json.loads(Path(m).read_text()) for m in glob.glob(f"{out}/*.stepscope.json")]
    return {"flushed": ok, **manifest}


def compare(out: Path, manifest: dict) -> dict:
    ours_path = out / manifest["trace_file"]
    ours = json.loads(ours_path.read_text())
    if not (out / "gpu.kineto.json").exists():
        # The glue fell back to Kineto's own writer (a libtorch without what it needs).
        return {"kineto_reference": False, "events": len(ours["traceEvents"]),
                "written_by_stepscope": sum(ln.startswith('{"ph": "X", "cat": "')
                                            for ln in ours_path.read_text().splitlines())}  # fmt: skip
    kineto = json.loads((out / "gpu.kineto.json").read_text())
    ours_lines = collections.Counter(
        json.loads(ln.rstrip(","))["cat"]
        for ln in ours_path.read_text().splitlines()
        if ln.startswith('{"ph": "X", "cat": "')
    )
    all_cats = collections.Counter(e.get("cat", e.get("ph")) for e in kineto["traceEvents"])
    return {
        **kineto_compare.compare(ours, kineto),
        "by_category": dict(all_cats),
        "written_by_stepscope": dict(ours_lines),
        "json_bytes": {"stepscope": ours_path.stat().st_size, "kineto": (out / "gpu.kineto.json").stat().st_size},
    }


def main() -> None:
    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    torch.cuda.init()
    workload(5)
    torch.cuda.synchronize()
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}), flush=True)
    failed = False
    for stack, steps in ((False, 3), (True, 3), (True, 30)):
        out = work / f"stack{int(stack)}-steps{steps}"
        out.mkdir()
        began = time.monotonic()
        m = capture(out, stack, steps)
        row = {"with_stack": stack, "steps": steps, "status": m["status"], "error": m.get("error"),
               "seconds": round(time.monotonic() - began, 2)}  # fmt: skip
        if m["status"] == "complete":
            row.update(compare(out, m))
        failed |= not (row.get("same_events") and row.get("same_header"))
        print(json.dumps(row), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
