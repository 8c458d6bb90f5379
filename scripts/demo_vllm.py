"""`make demo`'s main part: stepscope inside a live `vllm serve`, as a user meets it.

vLLM's CPU build serves a tiny random-weight Llama (tests/python/live_vllm.py) with vLLM's own
`--profiler-config` and stepscope's plugin installed (nothing else set: vLLM's default torch
profiler config). Then: `POST /start_profile`, a few requests, `POST /stop_profile` while
short requests keep coming, and what is on disk the moment the stop returns. The trace
directory is left for `stepscope analyze` (the Makefile runs it next).

    .venv/bin/python scripts/demo_vllm.py OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from live_vllm import VllmServer, cpu_build_missing  # noqa: E402


def say(*args: object) -> None:
    print(*args, flush=True)


def main(out: Path) -> int:
    if reason := cpu_build_missing():
        say(f"cannot run a live vLLM here: {reason}")
        return 2
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="stepscope-demo-"))
    srv = VllmServer(work, {"profiler": "torch", "torch_profiler_dir": str(out.resolve())},
                     args=["--enforce-eager"])
    say("== vllm serve of a 2-layer random-weight Llama on this CPU, vLLM's --profiler-config "
        "with the stepscope plugin")
    say("   starting (40-120 s on a 2-core machine) ...")
    began = time.monotonic()
    try:
        srv.start(progress=lambda s, line: say(f"   ... {s:.0f} s: {line[:110]}"))
        say(f"   ready in {time.monotonic() - began:.0f} s on http://127.0.0.1:{srv.port}")

        status, _, s = srv.post("/start_profile")
        say(f"== POST /start_profile: HTTP {status} in {s * 1000:.0f} ms")
        latencies = srv.complete(6, 32)
        say(f"== 6 concurrent requests of 32 tokens, captured: median {sorted(latencies)[3]:.2f} s")

        # Short requests, one after another, for as long as the stop takes.
        stop_done = threading.Event()
        served: list[float] = []

        def traffic() -> None:
            while not stop_done.is_set():
                served.append(srv.completion(8, 8, seed=len(served))[1])

        t = threading.Thread(target=traffic)
        t.start()
        status, body, s = srv.post("/stop_profile")
        stop_done.set()
        listing = sorted(p.name for p in out.iterdir())  # at once, as a script would
        t.join()
        say(f"== POST /stop_profile: HTTP {status} in {s * 1000:.0f} ms, returned with the "
            f"traces on disk; {len(served)} request(s) of 8 tokens were sent and served while "
            "it waited (the engine does not stop for the write)")
        if status != 200:
            say(f"   {body}")
            return 1
        for name in listing:
            if name.endswith(".stepscope.json"):
                m = json.loads((out / name).read_text())
                what = ("the API server's own CPU trace" if ".async_llm." in name
                        else f"{m.get('iterations', 0)} engine iteration(s)")
                say(f"   {m['trace_file']}: {m['status']}, {m.get('trace_bytes', 0) / 1e6:.1f} MB, "
                    f"{what}, written {m['writer_seconds']:.2f} s after the stop")
        leftovers = [n for n in listing if n.startswith(".") or ".partial" in n]
        say(f"   temporaries left in {out}: {leftovers or 'none'}")
    finally:
        say("== stopping the server")
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/vllm")))
