"""verl's rollout contract in a live vLLM (vLLM's CPU build): when ``await
engine.stop_profile()`` returns, the session's traces are on disk, so verl's relocation, which
moves every file of the replica's trace directory at once, moves whole traces and complete
manifests, and no temporary; requests keep being served while a stop waits; a start refused
by a capture limit is an error (HTTP 503 naming the key, ``StartRefused`` from AsyncLLM), and
the engine goes on.

The engine runs in ``verl_rollout.py`` (a child process: one ``AsyncLLM`` with vLLM's own HTTP
app, as verl's ``vLLMHttpServer`` runs them); its trace directory is a 256 MB tmpfs this test
mounts, so that the refusal comes from a real disk short of space. Its size bounds each
session's traces: they grow with the session's length, which is the machine's load's (the
worker's and the frontend's Python stacks record each turn of their loops; on 24 MB, a last
session of 26 s under `make test`'s load did not fit). The filler that makes it short of space
lives in memory only for the refusals.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from live_vllm import Progress, cpu_build_missing, group_alive, keep_modelinfos, live_env

pytestmark = [
    pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing())),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting the test's tmpfs needs root"),
]

SCRIPT = Path(__file__).parent / "verl_rollout.py"
#: verl_rollout.py's line before its refusals (importing it would import vLLM here).
REFUSALS_BEGIN = "== the refusals begin"
CLI = os.environ.get("STEPSCOPE_CLI") or str(
    Path(__file__).resolve().parents[2] / "target" / "debug" / "stepscope"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("verl")
    save_path = workdir / "save"
    # verl's layout: each rollout replica writes under save_path/agent_loop_rollout_replica_<r>.
    trace_dir = save_path / "agent_loop_rollout_replica_0"
    trace_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(trace_dir)], check=True)
    ipc = tempfile.mkdtemp(prefix="stepscope-verl-")
    env = live_env(ipc)
    # verl builds the engine's config itself: the CPU platform's KV cache from its variable,
    # in whole GiB (1, the least).
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    # Below the tmpfs's size, above what the filled disk leaves.
    env["STEPSCOPE_CONFIG"] = json.dumps({"stepscope": {"min_free_disk_mb": 8}})
    result = workdir / "result.json"
    log = workdir / "log.txt"
    proc = None
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), str(workdir), str(trace_dir), str(save_path),
                 str(result)],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        # However long the run takes on this machine, as long as it works.
        working = Progress(proc.pid, log)
        while proc.poll() is None:
            hung = working.hung()
            if hung is not None:
                text = log.read_text(errors="replace")[-6000:]
                raise AssertionError(f"verl's rollout run is hung: {hung}\n{text}")
            time.sleep(1)
        text = log.read_text(errors="replace")
        assert proc.returncode == 0, text[-6000:]
        keep_modelinfos(env["VLLM_CACHE_ROOT"])
        yield {"result": json.loads(result.read_text()), "log": text, "save_path": save_path}
    finally:
        if proc is not None:
            # The engine's processes (its session) end after the script; none outlives the test.
            deadline = time.monotonic() + 60
            while group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        subprocess.run(["umount", "-l", str(trace_dir)], check=False)
        shutil.rmtree(ipc, ignore_errors=True)


def test_each_stop_returns_with_its_traces_on_disk_and_verls_relocation_moves_them_whole(run):
    r = run["result"]
    for session in r["sessions"]:
        moved = session["moved"]
        # Nothing but whole files: a trace, its manifest and the op table (vLLM's), per
        # worker and frontend; no temporary, no manifest mid-write.
        assert not [m for m in moved if ".partial" in m or m.startswith(".")], moved
        traces = [m for m in moved if m.endswith(".pt.trace.json.gz")]
        manifests = [m for m in moved if m.endswith(".stepscope.json")]
        assert traces and len(traces) == len(manifests), moved
        assert all(m.startswith("rollout-replica0_") for m in moved)
    # Both sessions' pairs, complete where they were moved, each manifest finding its trace
    # under the relocated name.
    pairs = r["pairs"]
    assert len(pairs) == sum(
        len([m for m in s["moved"] if m.endswith(".stepscope.json")]) for s in r["sessions"]
    )
    for p in pairs:
        assert p["status"] == "complete", p
        assert p["trace"] == p["manifest"].replace(".stepscope.json", ".pt.trace.json.gz"), p
    # Nothing logged as failed (before the refusals, which are).
    before, marker, _ = run["log"].partition(REFUSALS_BEGIN)
    assert marker
    failures = [
        line for line in before.splitlines()
        if "stepscope" in line and ("failed" in line or "cannot write" in line)
    ]  # fmt: skip
    assert not failures, failures


def test_requests_sent_while_a_stop_waits_are_served_before_it_returns(run):
    held = run["result"]["sessions"][1]
    assert held["stop_returned_while_held"] is False
    assert held["served_while_the_stop_waited"] == [4, 4, 4]
    assert held["held_marker"].split()[0] == "600", held["held_marker"]


def test_analyze_reads_both_sessions_traces_where_verl_moved_them(run):
    out = subprocess.run(
        [CLI, "analyze", "--json", str(run["save_path"])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert not doc["errors"], doc["errors"]
    files = sorted(os.path.basename(t["file"]) for t in doc["traces"])
    expected = sorted(p["trace"] for p in run["result"]["pairs"])
    assert files == expected


def test_a_start_on_a_disk_short_of_space_is_refused_naming_the_key_and_the_engine_serves_on(run):
    r = run["result"]
    status, body = r["refused_http"]
    assert status == 503, (status, body)
    assert body["key"] == "stepscope.min_free_disk_mb", body
    assert "MB free" in body["error"], body
    refused = r["refused_engine"]
    assert refused is not None, "AsyncLLM.start_profile() returned on a full disk"
    assert refused["type"] == "StartRefused" and refused["key"] == "stepscope.min_free_disk_mb"
    assert r["served_after_refusal"] == 4
    assert r["completion_after_refusal"] == 200
    # With room again, the next session is captured and on disk when its stop returns.
    after = r["after_room"]
    assert any(f.endswith(".pt.trace.json.gz") for f in after), after
    assert not [f for f in after if ".partial" in f], after
