"""Fresh Python processes that begin with torch already imported, for tests that run vLLM's
plugin loading in a process of its own.

Such a child imports vLLM, loads its plugins and says what it found. Of the ~17 s of CPU that
takes, ~10 s is torch (with dynamo and inductor, which vLLM imports at once), transformers,
sympy and the like, before any of vLLM's or stepscope's code runs; on two cores, with live
servers beside it, a child took 50-90 s. Here one server process imports those libraries once
and forks a child per run: the child is the process of a user who imported torch before vLLM,
neither vLLM nor stepscope imported yet (checked when the server starts), with its own
environment, working directory, argv, stdout and stderr, and a normal interpreter exit (atexit
handlers, stdio flushed), its status the exit status of `python -c CODE` or `python -m MODULE`.

What the server imports is what vLLM's import and plugin loading import from other packages
(`-X importtime` of a child), and the server freezes its objects out of the garbage collector
(`gc.freeze()`, Python's advice before a fork): a child's collections then walk only its own
objects, not the server's, and leave the pages it shares with the server unwritten. A child of
test_vllm_plugin.py's (load the plugins, make a profiler) used 6.1 s of CPU with torch, dynamo,
inductor, sympy, transformers, openai, fastapi and aiohttp imported; 2.7 s with the rest of
the list; 0.9 s with the server frozen (vLLM 0.32, an idle machine; 1.1 s under vLLM 0.33).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# What vLLM's import and its plugin loading import from other packages, in a fresh process
# (measured with -X importtime: of the 4.4 s a child spent importing other packages' modules,
# torch._inductor.lowering alone was 2.1 s).
PRELOAD = ("numpy", "torch", "torch._dynamo", "torch._inductor", "torch._inductor.lowering",
           "sympy", "transformers", "transformers.models.auto.image_processing_auto",
           "transformers.models.auto.modeling_auto", "transformers.modeling_gguf_pytorch_utils",
           "transformers.generation.configuration_utils", "openai", "fastapi", "aiohttp",
           "tabulate", "requests", "zmq", "psutil", "msgspec")  # fmt: skip
# Never in the server: the children import them as a fresh process does.
FRESH = ("vllm", "stepscope")

SERVER = r"""
import importlib, json, os, sys, traceback
ctl_in = os.fdopen(os.dup(0), "r")
ctl_out = os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
preload, fresh = json.loads(sys.argv[1]), json.loads(sys.argv[2])
hello = {"ready": True}
try:
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:  # not in this environment: its children import what they need
            pass
except Exception:
    hello = {"ready": False, "error": traceback.format_exc()}
hello["early"] = sorted(m for m in sys.modules if m.split(".")[0] in fresh)
import gc
gc.freeze()
ctl_out.write(json.dumps(hello) + "\n")
ctl_out.flush()
child = None
for line in ctl_in:
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child = req
        break
    ctl_out.write(json.dumps({"pid": pid}) + "\n")
    ctl_out.flush()
    _, status = os.waitpid(pid, 0)
    ctl_out.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
    ctl_out.flush()
if child is None:
    raise SystemExit(0)


def become(child, ctl_in, ctl_out, null):
    # This process is now `python -c CODE` or `python -m MODULE`: in __main__'s namespace,
    # emptied of the server's names.
    import builtins, os, runpy, sys

    ctl_in.close()
    ctl_out.close()
    os.chdir(child["cwd"])
    os.environ.clear()
    os.environ.update(child["env"])
    for fd, path in ((1, child["out"]), (2, child["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.close(null)
    sys.argv = child["argv"]
    main = sys.modules["__main__"].__dict__
    main.clear()
    main.update(__name__="__main__", __builtins__=builtins)
    if child["module"]:
        sys.path[0] = os.getcwd()
        runpy.run_module(child["module"], run_name="__main__", alter_sys=True)
    else:
        exec(compile(child["code"], "<string>", "exec"), main)


become(child, ctl_in, ctl_out, null)
"""


class Forker:
    """One server process of this interpreter (`sys.executable`) with `PRELOAD` imported;
    `run` forks a child of it. Close it when done (a pytest fixture does)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(PRELOAD), json.dumps(FRESH)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        hello = self._reply(600)
        if hello is None or not hello["ready"] or hello["early"]:
            self.close()
        if hello is None:
            raise RuntimeError(f"the fork server exited ({self.proc.returncode}) before its hello")
        if not hello["ready"]:
            raise RuntimeError(f"the fork server's imports failed:\n{hello['error']}")
        if hello["early"]:
            raise RuntimeError(f"preloading imported {hello['early']}: not a fresh process")

    def _reply(self, timeout: float) -> dict | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    def run(
        self,
        *,
        code: str | None = None,
        module: str | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 600,
    ) -> subprocess.CompletedProcess:
        """As `subprocess.run([sys.executable, "-c", code, *args])` (or `-m module`) with
        `env` (default: this process's), text output captured."""
        assert (code is None) != (module is None)
        argv0 = "-c" if code is not None else str(Path(sys.executable))
        with tempfile.TemporaryDirectory(prefix="stepscope-fork-") as d:
            out, err = Path(d, "out"), Path(d, "err")
            req = {
                "code": code, "module": module, "argv": [argv0, *(args or [])],
                "env": dict(os.environ if env is None else env), "cwd": os.getcwd(),
                "out": str(out), "err": str(err),
            }  # fmt: skip
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            started = self._reply(60)
            if started is None:
                self.close()
                raise RuntimeError(f"the fork server exited ({self.proc.returncode})")
            done = self._reply(timeout)
            if done is None:
                os.kill(started["pid"], signal.SIGKILL)
                self._reply(60)
                raise subprocess.TimeoutExpired(req["argv"], timeout, err.read_text())
            cmd = [sys.executable, *(["-c", code] if code is not None else ["-m", module])]
            return subprocess.CompletedProcess(
                [*cmd, *(args or [])], done["rc"], out.read_text(), err.read_text()
            )

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
