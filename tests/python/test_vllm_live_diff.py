"""`stepscope diff` on live `vllm serve` captures (vLLM's CPU build): captures of the same
workload on an unchanged server show no change beyond noise; captures with the model's forward
pass made slower in one place show its steps slower and that place first.

The regression is the model's own (tests/python/vllm_slow_step, `DelayableLlama`): while a file
exists, every forward pass sleeps inside a `record_function` range for a multiple of the median
period of its forward passes before, so the same share of a step on any CPU; nothing here waits
for a fixed time or compares times with a threshold. Each capture is the same requests (one
completion of four prompts, which vLLM admits together: the same batches).

The three sides are captured interleaved, each side a directory of its captures: in `make
test` this server shares two cores with nine other pytest processes, and one capture's decode
steps were measured 4x slower than the next one's on the same unchanged server. Interleaved,
such stretches fall on every side alike. The two unchanged sides also take turns at going first
(first, second, slower, then second, first, slower, ...): while the other processes' load ebbed
through a run (their servers up, their tests done), a fixed order made every `second` capture
the later one, and on a fresh machine the two read 27% apart in their decode steps, "faster"
(an even number of rounds so ordered cancels a steady drift).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from live_vllm import VllmServer, cpu_build_missing, slow_step_env
from test_vllm_live import stepscope_cli

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

from vllm_slow_step.stepscope_slow_step import DELAY_RANGE  # noqa: E402

#: Rounds of captures: even, so that each unchanged side goes first as often as the other.
CAPTURES = 4
API_KEY = "stepscope-test-key"
PROMPTS = 4
PROMPT_LEN = 24
MAX_TOKENS = 24


def delayable_server(workdir: Path, api_key: str | None = None) -> VllmServer:
    """A (not yet started) server of `DelayableLlama` with stepscope's plugin and vLLM's default
    torch profiler config but Python stacks: traces in `workdir/traces`, the delay switched on by creating
    `workdir/slower` (`srv.switch`); with `api_key`, started with `--api-key`."""
    srv = VllmServer(
        workdir,
        # Without Python stacks (vLLM records them by default): the worker's Python tracer
        # records every turn of the loop in which it waits for its next step (vLLM's shared
        # memory queue: memory_fence, sched_yield). Beside make test's other processes one
        # capture of the same requests held 272,000 such events, a later one 735,000: the
        # more the machine was loaded the longer the wait, the larger the trace, the more
        # writing it loaded the machine; this server's worker used 18 CPU minutes.
        {"profiler": "torch", "torch_profiler_dir": str(workdir / "traces"),
         "torch_profiler_with_stack": False},
        env=slow_step_env(STEPSCOPE_TEST_DELAY_FILE=str(workdir / "slower")),
        model_config={"architectures": ["DelayableLlama"]},
        args=["--enforce-eager"],
        api_key=api_key,
    )
    srv.traces = workdir / "traces"
    srv.switch = workdir / "slower"
    return srv


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # With an API key: the last test checks who may read stepscope's routes.
    srv = delayable_server(tmp_path_factory.mktemp("vllm-live-diff"), api_key=API_KEY)
    try:
        yield srv.start()
    finally:
        srv.stop()


def workload(server: VllmServer, rounds: int = 1) -> None:
    """The fixed request set, `rounds` times: one completion of four prompts."""
    for r in range(rounds):
        prompts = [
            [3 + (r * 97 + p * 31 + k) % 500 for k in range(PROMPT_LEN)] for p in range(PROMPTS)
        ]
        server.completion_of(prompts, MAX_TOKENS)


def capture(server: VllmServer, into: Path) -> None:
    """One capture of the workload; its worker's trace and manifest are moved into the
    directory `into` the moment the stop returns (as an RL trainer moves them)."""
    status, answer, _ = server.post("/start_profile")
    assert status == 200, answer
    workload(server)
    status, answer, _ = server.post("/stop_profile")
    assert status == 200, answer
    into.mkdir(exist_ok=True)
    moved = 0
    for manifest in list(server.traces.glob("*.stepscope.json")):
        m = json.loads(manifest.read_text())
        if m["worker_name"] != "rank0":
            manifest.unlink()
            (server.traces / m["trace_file"]).unlink(missing_ok=True)
            continue
        assert m["status"] == "complete", m
        shutil.move(server.traces / m["trace_file"], into / m["trace_file"])
        shutil.move(manifest, into / manifest.name)
        moved += 1
    assert moved == 1, list(into.iterdir())


def diff(before: Path, after: Path) -> dict:
    out = subprocess.run(
        [stepscope_cli(), "diff", str(before), str(after), "--json", "--top", "0"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_an_unchanged_server_shows_no_change_and_a_slower_model_its_slower_place(
    server, tmp_path
):
    # Warm-up: vLLM's first steps are slower (allocations, caches).
    workload(server, 3)
    first, second, slower = (tmp_path / side for side in ("first", "second", "slower"))
    for r in range(CAPTURES):
        for side in (first, second) if r % 2 == 0 else (second, first):
            capture(server, side)
        server.switch.touch()
        capture(server, slower)
        server.switch.unlink()

    same = diff(first, second)
    judged = [g for g in same["groups"] if g["verdict"] not in ("too_few", "only_before", "only_after")]
    assert judged, same["groups"]
    decode = [g for g in judged if g["key"]["stage"] == "decode"]
    assert decode, judged
    for g in judged:
        assert g["verdict"] == "no_change", g
    # Names were compared from the traces: the same names on both sides.
    assert all(g["names_compared"] for g in same["groups"])
    assert not any(n["name"] == DELAY_RANGE for g in same["groups"] for n in g["names"])

    changed = diff(first, slower)
    by_group = {g["group"]: g for g in changed["groups"]}
    for g in decode:
        after = by_group[g["group"]]
        assert after["verdict"] == "slower", after
        names = after["names"]
        injected = next((n for n in names if n["name"] == DELAY_RANGE), None)
        assert injected is not None, names[:3]
        assert (injected["category"], injected["status"]) == ("annotation", "added"), injected
        # One delay per forward pass, each step one forward pass.
        assert injected["after"]["count"] == 1.0, injected
        # First, or behind only names that ran as often but slower: once, beside the other
        # live servers of make test, aten::copy_ took +196 ms a step on the slower side alone,
        # its 43 calls a step the same (our guess, not measured: the sleep lets vLLM's OpenMP
        # threads park, and each parallel op after it waits for them on a busy core).
        ahead = names[: names.index(injected)]
        assert all(
            n["status"] == "same" and n["before"]["count"] == n["after"]["count"] for n in ahead
        ), ahead
    # The changed groups come first.
    assert changed["groups"][0]["verdict"] == "slower"

    # The text says the same, for a person.
    text = subprocess.run(
        [stepscope_cli(), "diff", str(first), str(slower)],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    assert "SLOWER" in text and DELAY_RANGE in text, text


def status_of(url: str, authorization: str | None) -> int:
    """The HTTP status of a GET with this `Authorization` header (or none)."""
    request = urllib.request.Request(url, headers={"Authorization": authorization} if authorization else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_stepscope_routes_answer_only_with_the_servers_api_key(server):
    base = f"http://127.0.0.1:{server.port}"
    for path in ("/stepscope/status", "/stepscope/timeline?since=0", "/stepscope/requests?since=0"):
        assert status_of(base + path, None) == 401, path
        assert status_of(base + path, "Bearer not-the-key") == 401, path
        assert status_of(base + path, f"Bearer {API_KEY}") == 200, path
    # vLLM's own guard is as it was.
    assert status_of(base + "/v1/models", None) == 401

    # ctl sends the key it is given, by flag or environment, and says what a 401 means.
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_API_KEY"}
    ctl = [stepscope_cli(), "ctl", "status", "--worker", base, "--json"]
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=120)
    denied = run(ctl, env=env)
    assert denied.returncode == 1, denied.stdout + denied.stderr
    (answer,) = json.loads(denied.stdout)["workers"]
    assert answer["status"] == 401 and "--api-key" in answer["error"], answer
    for args, extra in (([f"--api-key={API_KEY}"], {}), ([], {"STEPSCOPE_API_KEY": API_KEY})):
        ok = run(ctl + args, env={**env, **extra})
        assert ok.returncode == 0, ok.stdout + ok.stderr
        (answer,) = json.loads(ok.stdout)["workers"]
        assert "phase" in answer["engine_workers"][0], answer

    # This server keeps no request log (stepscope.requests is off): its engine core says so,
    # and ctl requests says how to turn it on.
    status, answer, _ = server.get("/stepscope/requests")
    assert status == 200 and answer["engines"][0]["requests"] is None, answer
    off = run([stepscope_cli(), "ctl", "requests", "--worker", base, f"--api-key={API_KEY}"], env=env)
    assert off.returncode == 1, off.stdout + off.stderr
    assert '"requests": true' in off.stdout, off.stdout

    # vLLM's own profile routes keep vLLM's rule (not guarded), under the plugin too.
    request = urllib.request.Request(base + "/start_profile", method="POST")
    with urllib.request.urlopen(request, timeout=60) as r:
        assert r.status == 200
    status, answer, _ = server.post("/stop_profile")
    assert status == 200, answer
    shutil.rmtree(server.traces, ignore_errors=True)
