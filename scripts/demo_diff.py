"""`stepscope diff` as a user runs it, on a live `vllm serve` (vLLM's CPU build, a tiny model):
the same fixed request set captured three times with `stepscope ctl start --max-iterations`,
`ctl stop --wait`, and the files moved away; the third time with the model's forward pass made
slower in one place (tests/python/vllm_slow_step's `DelayableLlama`, switched on by a file).
Then `stepscope diff` of the first two (an unchanged server) and of the first and the third.

    .venv/bin/python scripts/demo_diff.py OUT_DIR

Leaves OUT_DIR/{first,second,slower}, each one capture's traces and manifests. The README's
worked example of `diff` is this script's output.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from live_vllm import VllmServer, cpu_build_missing  # noqa: E402
from test_vllm_live import stepscope_cli  # noqa: E402
from test_vllm_live_diff import delayable_server, workload  # noqa: E402

ITERATIONS = 60


def say(*args: object) -> None:
    print(*args, flush=True)


def capture(srv: VllmServer, cli: str, into: Path) -> None:
    url = f"http://127.0.0.1:{srv.port}"
    for cmd in (["start", "--max-iterations", str(ITERATIONS)], None, ["stop", "--wait"]):
        if cmd is None:
            workload(srv, 3)
            continue
        say(f"$ stepscope ctl {' '.join(cmd)} --worker {url}")
        subprocess.run([cli, "ctl", *cmd, "--worker", url], check=True, stdout=subprocess.DEVNULL)
    into.mkdir()
    for f in srv.traces.iterdir():
        shutil.move(f, into / f.name)
    say(f"$ mv traces/* {into.name}/")


def main(out: Path) -> int:
    if reason := cpu_build_missing():
        say(f"cannot run a live vLLM here: {reason}")
        return 2
    cli = stepscope_cli()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="stepscope-demo-diff-"))
    srv = delayable_server(work)
    say("== vllm serve of a 2-layer random-weight Llama (starting: 40-120 s)")
    try:
        srv.start(progress=lambda s, line: say(f"   ... {s:.0f} s: {line[:100]}"))
        workload(srv, 3)  # warm-up
        capture(srv, cli, out / "first")
        capture(srv, cli, out / "second")
        srv.switch.touch()
        say("== the model's forward pass made slower in one place")
        capture(srv, cli, out / "slower")
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    for a, b in (("first", "second"), ("first", "slower")):
        say(f"\n$ stepscope diff {a} {b} --top 5")
        text = subprocess.run(
            [cli, "diff", a, b, "--top", "5"], cwd=out, check=True, capture_output=True, text=True
        ).stdout
        say(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/diff")))
