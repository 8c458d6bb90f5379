"""How long SGLang's scheduler waits at the end of a capture: SGLang's own profiler against the
stepscope plugin, on SGLang's real profiler manager (CPU, real Kineto), same work, same process.

For each profiler, rounds alternate: a capture of N forward batches (CPU matmuls under
``with_stack``, SGLang's default), ended by ``/stop_profile``; timed are the scheduler's stop
call (SGLang's own: export + barrier inside it; stepscope's: the hand-off) and the time until
the trace is on disk. Stand-ins as in tests/python/test_sglang.py (one-process gloo group, the
parallel state through SGLang's own override, namespace batches).

    .venv-sglang/bin/python scripts/bench_sglang_stop.py [--batches 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

import stepscope.sglang as plugin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20, help="forward batches per capture")
    ap.add_argument("--rounds", type=int, default=3, help="captures per profiler")
    args = ap.parse_args()

    os.environ["SGLANG_PLUGINS"] = "stepscope"
    pm = importlib.import_module(plugin.MANAGER_MODULE)
    from sglang.srt import plugins
    from sglang.srt.managers.io_struct import ProfileReq, ProfileReqType
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_parallel

    plugins.load_plugins()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    pm.get_dp_tp_group = lambda: SimpleNamespace(cpu_group=dist.group.WORLD)
    ranks = dict(tp_rank=0, tp_size=1, num_dp_ranks=1, dp_rank=0, pp_size=1, pp_rank=0,
                 moe_ep_size=1, moe_ep_rank=0)  # fmt: skip

    ct = [0]
    manager = pm.SchedulerProfilerManager(get_forward_ct=lambda: ct[0])
    x = torch.randn(128, 128)
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, reqs=[object()] * 8,
                            extend_num_tokens=None, decoding_reqs=None)  # fmt: skip

    def capture(out: Path, profile_id: str, activities: list[str]) -> tuple[float, float]:
        nonlocal x
        reply = manager._profile(ProfileReq(output_dir=str(out), activities=activities,
                                            with_stack=True, profile_id=profile_id))  # fmt: skip
        assert reply.success, reply.message
        for _ in range(args.batches):
            ct[0] += 1
            manager._profile_batch_predicate(batch)
            for _ in range(20):
                x = torch.mm(x, x).tanh()
        t0 = time.perf_counter()
        reply = manager._profile(ProfileReq(req_type=ProfileReqType.STOP_PROFILE))
        stop = time.perf_counter() - t0
        assert reply.success, reply.message
        trace = out / f"{profile_id}-TP-0.trace.json.gz"
        manifest = out / f"{profile_id}-TP-0.stepscope.json"
        while not trace.exists() or (
            manifest.exists() and json.loads(manifest.read_text())["status"] == "writing"
        ):
            time.sleep(0.001)
        return stop, time.perf_counter() - t0

    results: dict[str, list[tuple[float, float]]] = {"sglang": [], "stepscope": []}
    with get_parallel().override(**ranks), tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # "FOO" is an activity only SGLang's own profiler accepts (it skips it), so the
            # plugin leaves that request to SGLang: same CPU recording either way.
            own = capture(Path(tmp) / f"own{r}", f"own{r}", ["CPU", "FOO"])
            results["sglang"].append(own)
            results["stepscope"].append(capture(Path(tmp) / f"ss{r}", f"ss{r}", ["CPU"]))
    dist.destroy_process_group()

    print(
        f"{args.batches} forward batches per capture, with_stack, CPU activity; median of {args.rounds}"
    )
    print(f"{'profiler':<10} {'stop call (ms)':>15} {'trace on disk (ms)':>19}")
    for name, rows in results.items():
        stop = statistics.median(r[0] for r in rows) * 1e3
        disk = statistics.median(r[1] for r in rows) * 1e3
        print(f"{name:<10} {stop:>15.2f} {disk:>19.1f}")
    own, ss = (statistics.median(r[0] for r in results[k]) for k in ("sglang", "stepscope"))
    print(f"stop call: stepscope {own / ss:.0f}x shorter")


if __name__ == "__main__":
    main()
