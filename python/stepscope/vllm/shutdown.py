"""Process shutdown: vLLM's process managers wait while a child (or a worker below it) still
writes its traces, up to its flush timeout, before they terminate it."""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any

from stepscope.vllm.environment import logger
from stepscope.vllm.interfaces import PATCHED_MARK, signature_known

def _patch_process_shutdown(module: ModuleType) -> None:
    """The API server's ``CoreEngineProcManager`` ends engine processes with ``shutdown(procs,
    timeout)`` (``vllm.v1.utils``, imported by name into ``vllm.v1.engine.utils``): SIGTERM, a
    grace period (none under vLLM's default ``shutdown_timeout``), then SIGKILL to the whole
    process tree. Ours first gives a process with traces in flight (a flushing marker, its own
    or a worker's below it) up to the marker's flush timeout to finish them and exit."""
    original = getattr(module, "shutdown", None)
    if original is None or hasattr(original, PATCHED_MARK):
        return
    if not signature_known("shutdown", original, module):
        return

    def shutdown(procs: list[Any], timeout: float | None = None) -> None:
        try:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            wait_for_flushes(procs, grace=5.0 if timeout is None else timeout)
        except Exception:  # noqa: BLE001 - vLLM's own shutdown must still run
            logger.debug("stepscope: waiting for trace writers failed", exc_info=True)
        original(procs, timeout=timeout)

    shutdown.__doc__ = original.__doc__
    setattr(shutdown, PATCHED_MARK, original)
    module.shutdown = shutdown


def _patch_multiproc_executor(module: ModuleType) -> None:
    """The engine process ends its workers with ``_ensure_worker_termination``: a grace period
    (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``), SIGTERM, 4 s, SIGKILL. A SIGTERM interrupts a
    worker still writing its traces; ours waits for such a worker first."""
    executor = getattr(module, "MultiprocExecutor", None)
    original = getattr(executor, "_ensure_worker_termination", None)
    if original is None or hasattr(original, PATCHED_MARK):
        return
    if not signature_known("MultiprocExecutor._ensure_worker_termination", original, module):
        return

    def _ensure_worker_termination(worker_procs: list[Any]) -> None:
        try:
            grace = float(os.environ.get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "5"))
            wait_for_flushes(worker_procs, grace=grace)
        except Exception:  # noqa: BLE001 - vLLM's own termination must still run
            logger.debug("stepscope: waiting for trace writers failed", exc_info=True)
        original(worker_procs)

    setattr(_ensure_worker_termination, PATCHED_MARK, original)
    executor._ensure_worker_termination = staticmethod(_ensure_worker_termination)


def wait_for_flushes(procs: list[Any], *, grace: float) -> None:
    """Waits up to ``grace`` seconds for ``procs`` (multiprocessing processes) to exit, and
    longer while one still alive has traces in flight (a flushing marker of its own or of a
    descendant; see :func:`stepscope.flushing_marker`): up to the marker's flush timeout."""
    start = time.monotonic()
    announced = False
    while True:
        alive = [p.pid for p in procs if p.is_alive()]
        if not alive:
            return
        timeout = _flushing_timeout(alive)
        waited = time.monotonic() - start
        if waited >= max(grace, timeout or 0.0):
            return
        if timeout is not None and not announced:
            logger.info(
                "stepscope: waiting up to %.0f s for traces being written before the "
                "process ends",
                timeout - waited,
            )
            announced = True
        time.sleep(0.05)


def _flushing_timeout(pids: list[int]) -> float | None:
    """The longest flush timeout among the flushing markers of live processes that are one of
    ``pids`` or descend from one; None when there is none."""
    import stepscope

    roots = set(pids)
    longest = None
    for pid, timeout in stepscope.flushing_markers().items():
        if _descends_from(pid, roots):
            longest = timeout if longest is None else max(longest, timeout)
    return longest


def _descends_from(pid: int, roots: set[int]) -> bool:
    """Whether live process ``pid`` is in ``roots`` or below one of them (Linux's /proc)."""
    for _ in range(64):
        if pid in roots:
            return True
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            return False
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if pid <= 1:
            return False
    return False
