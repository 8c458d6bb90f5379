"""Shared helpers for the Python tests: the real-mechanism doubles (a stub libcuda.so on the
loader path, the NVTX injection library nsys's place), and engine scripts run in a child
process so the loader sees the stub from its start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The venv's vllm is vLLM's CPU build (scripts/setup.sh): without the CPU platform chosen, vLLM
# loads its default kernels, built for AVX-512, which stop a CPU without it (SIGILL). Children
# the tests start inherit it.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@dataclass
class Event:
    """One line of the doubles' log: source (`cuda`/`nvtx`), thread, name, fields."""

    source: str
    tid: int
    name: str
    args: list[str] = field(default_factory=list)

    def arg(self, i: int) -> str:
        return self.args[i] if i < len(self.args) else ""


def read_log(path: Path) -> list[Event]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            events.append(Event(parts[0], int(parts[1]), parts[2], parts[3:]))
    return events


@dataclass
class Run:
    result: dict
    events: list[Event]
    stderr: str

    def calls(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]

    def driver(self) -> list[tuple[str, str]]:
        """cuProfilerStart/Stop calls in order, with their result codes."""
        return [
            (e.name, e.arg(0))
            for e in self.events
            if e.source == "cuda" and e.name in ("cuProfilerStart", "cuProfilerStop")
        ]


@pytest.fixture(scope="session")
def fresh_python():
    """Fresh processes of this Python, forked from one that has imported torch and the
    libraries vLLM imports (tests/python/forked.py), started at first use."""
    from forked import Forker

    forker = Forker()
    yield forker
    forker.close()


@pytest.fixture(scope="session")
def doubles() -> dict:
    """Paths of the stub libcuda.so and the NVTX recorder, built by cargo."""
    out = subprocess.run(
        ["cargo", "run", "-q", "-p", "stepscope-test-doubles", "--bin", "doubles-paths"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


PRELUDE = """
import json, os, sys, threading
import stepscope
RESULT = {}
def engine(p, n, iteration=None):
    '''n engine iterations; returns whether each was captured.'''
    captured = []
    for i in range(n):
        p.step(iteration(i + 1) if iteration else None)
        captured.append(p.is_running)
        p.step_end()
    return captured
"""


@pytest.fixture
def engine_script(doubles, tmp_path):
    """Runs `code` (after PRELUDE) in a child Python with the stub driver and the NVTX
    recorder; `RESULT` (a dict) comes back with the doubles' log."""

    def run(code: str, env: dict | None = None, driver: bool = True) -> Run:
        log = tmp_path / "doubles.log"
        log.unlink(missing_ok=True)
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
        child_env.update(
            {
                doubles["log_env"]: str(log),
                "NVTX_INJECTION64_PATH": doubles["nvtx_recorder"],
                # Only the stub (or no driver at all) can be found.
                "LD_LIBRARY_PATH": doubles["cuda_stub_dir"] if driver else "",
            }
        )
        for k, v in (env or {}).items():
            if v is None:
                child_env.pop(k, None)
            else:
                child_env[k] = v
        script = PRELUDE + textwrap.dedent(code) + "\nprint('RESULT ' + json.dumps(RESULT))\n"
        proc = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path,
            env=child_env,
            capture_output=True,
            text=True,
            # A hang guard, not a speed check: a child that imports SGLang took 35 s alone and
            # over 300 s beside make test's six other pytest processes on two cores.
            timeout=1200,
        )
        assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
        return Run(json.loads(line[len("RESULT ") :]), read_log(log), proc.stderr)

    return run


@pytest.fixture(scope="session")
def otlp_collector():
    """An OTLP/HTTP collector decoding what it receives (tests/python/otlp_receiver.py)."""
    from otlp_receiver import OtlpReceiver

    r = OtlpReceiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="session")
def token_cost_live(tmp_path_factory, otlp_collector):
    """One live `vllm serve` of `TokenCostLlama` shared by the request-log tests and the
    request-span tests (test_vllm_live_requests.shared_server): on the CI's two cores each
    server start costs minutes of CPU."""
    from test_vllm_live_requests import shared_server

    srv = shared_server(tmp_path_factory.mktemp("vllm-live-requests"), otlp_collector.url)
    try:
        yield srv.start()
    finally:
        otlp_collector.answer_again()
        srv.stop()


@pytest.fixture(scope="session")
def slow_step_live(tmp_path_factory):
    """One live `vllm serve` of `SlowStepLlama` shared by the slow-step trigger's test and the
    request-log ring's (test_vllm_live_trigger.shared_server)."""
    from test_vllm_live_trigger import shared_server

    srv = shared_server(tmp_path_factory.mktemp("vllm-live-trigger"))
    try:
        yield srv.start()
    finally:
        srv.stop()
