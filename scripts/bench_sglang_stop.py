"""How long SGLang's scheduler waits at the end of a capture: SGLang's own profiler against the
stepscope plugin, on SGLang's real profiler manager (CPU, real Kineto), same work, same process.

For each profiler, rounds alternate: a capture of N forward batches (CPU matmuls under
``with_stack``, SGLang's default), ended by ``/stop_profile``; timed are the scheduler's stop
call (SGLang's own: export + barrier inside it; stepscope's: the hand-off) and the time until
the trace is on disk. The scheduler process and its batches are tests/python/test_sglang.py's
(`scheduler_process`, `Scheduler`): one-process gloo group, the parallel state through SGLang's
own override, namespace batches.

    .venv-sglang/bin/python scripts/bench_sglang_stop.py [--batches 20] [--rounds 3]
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import test_sglang as harness  # noqa: E402 - SGLang's scheduler modules and the stand-ins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20, help="forward batches per capture")
    ap.add_argument("--rounds", type=int, default=3, help="captures per profiler")
    args = ap.parse_args()

    def capture(s: harness.Scheduler, out: Path, profile_id: str, activities: list[str]):
        reply = s.profile(output_dir=str(out), activities=activities, with_stack=True,
                          profile_id=profile_id)  # fmt: skip
        assert reply.success, reply.message
        for _ in range(args.batches):
            s.run(harness.D, reqs=20)  # 20 requests: 20 matmuls of the batch's work
        t0 = time.perf_counter()
        reply = s.stop()
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
    with harness.scheduler_process(), tempfile.TemporaryDirectory() as tmp:
        s = harness.Scheduler()
        for r in range(args.rounds):
            # "FOO" is an activity only SGLang's own profiler accepts (it skips it), so the
            # plugin leaves that request to SGLang: same CPU recording either way.
            own = capture(s, Path(tmp) / f"own{r}", f"own{r}", ["CPU", "FOO"])
            results["sglang"].append(own)
            results["stepscope"].append(capture(s, Path(tmp) / f"ss{r}", f"ss{r}", ["CPU"]))

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
