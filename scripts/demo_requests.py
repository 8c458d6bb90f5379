"""`stepscope ctl requests` as a user runs it, on a live `vllm serve` (vLLM's CPU build, a tiny
model whose steps take time in proportion to their tokens: tests/python/vllm_slow_step's
`TokenCostLlama`) with the request log on and chunked prefill of 128 tokens a step: a
900-token prompt, and three short requests sent while its first chunks run. Then the requests
ranked by queue wait and by TTFT. Then the same workload captured (`/start_profile`,
`/stop_profile`, with `"request_ids": true`): `stepscope analyze --requests` of the worker's
trace, one request's iterations, and the HTML report with its request waterfall.

    .venv/bin/python scripts/demo_requests.py

The README's and docs/vllm.md's worked examples of `ctl requests`, and docs/analyze.md's of
`analyze --requests`, are this script's output. With an argument, the report is written there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from live_vllm import cpu_build_missing  # noqa: E402
from test_vllm_live import stepscope_cli  # noqa: E402
from test_vllm_live_requests import long_prefill_with_short_requests, token_cost_server  # noqa: E402


def say(*args: object) -> None:
    print(*args, flush=True)


def main() -> int:
    if reason := cpu_build_missing():
        say(f"cannot run a live vLLM here: {reason}")
        return 2
    cli = stepscope_cli()
    work = Path(tempfile.mkdtemp(prefix="stepscope-demo-requests-"))
    srv = token_cost_server(work)
    say("== vllm serve of a 2-layer random-weight Llama, request log on (starting: 40-120 s)")
    try:
        srv.start(progress=lambda s, line: say(f"   ... {s:.0f} s: {line[:100]}"))
        srv.completion_of([3] * 8, 4)  # warm-up
        since, long_id = long_prefill_with_short_requests(srv)
        say(f"== a 900-token prompt ({long_id}), and three 8-token prompts sent meanwhile")
        url = f"http://127.0.0.1:{srv.port}"
        for args in (["--by", "queue", "--top", "2"], ["--by", "ttft", "--top", "2"]):
            cmd = ["ctl", "requests", "--worker", url, "--since-step", str(since), *args]
            say(f"\n$ stepscope {' '.join(cmd)}")
            out = subprocess.run([cli, *cmd], capture_output=True, text=True, check=False)
            say(out.stdout + out.stderr)

        say("== the same workload captured: /start_profile, the requests, /stop_profile")
        traces = work / "traces"
        assert srv.post("/start_profile")[0] == 200
        try:
            _, long_id = long_prefill_with_short_requests(srv, seed=150)
        finally:
            assert srv.post("/stop_profile")[0] == 200
        (manifest,) = traces.glob("rank0*.stepscope.json")
        trace = traces / json.loads(manifest.read_text())["trace_file"]

        def run(*cmd: str) -> str:
            say(f"\n$ stepscope {' '.join(cmd)}")
            out = subprocess.run([cli, *cmd], capture_output=True, text=True, check=False)
            say(out.stdout + out.stderr)
            return out.stdout

        run("analyze", "--top", "3", "--requests=2", str(trace))
        found = json.loads(
            subprocess.run(
                [cli, "analyze", "--json", "--requests=0", str(trace)],
                capture_output=True, text=True, check=True,
            ).stdout
        )  # fmt: skip
        short = next(r["id"] for r in found["requests"][0]["requests"] if r["id"] != long_id)
        run("analyze", "--request", short, str(trace))
        page = Path(sys.argv[1]) if len(sys.argv) > 1 else work / "report.html"
        run("report", str(trace), "-o", str(page))
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
