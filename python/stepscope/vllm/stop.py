"""vLLM's profiling contract, kept with traces written off the engine thread:

- **A stop returns when its traces are on disk.** ``AsyncLLM.stop_profile()`` (what
  ``/stop_profile``, verl's rollout server and other RL trainers await) and
  ``LLMEngine.stop_profile()`` (the offline ``LLM.stop_profile()``) first stop every worker as
  vLLM does (the engine never waits on a write), then wait, without holding the engine loop,
  until every trace that stop ended on every worker (and the API server's own CPU trace) is
  ``complete`` or ``failed``: short ``collective_rpc`` status calls between engine steps,
  bounded by ``stepscope.flush_timeout_s``. A failed write or a timeout raises
  :class:`stepscope.TraceNotWritten` naming the worker, the file and why. With
  ``"stepscope": {"stop_returns": "at_once"}`` a stop returns at once, as before.
- **A refused start is an error.** A worker's start refused by a capture limit
  (``stepscope.min_free_disk_mb``, ``max_capture_mb``) raises :class:`stepscope.StartRefused`
  from ``start_profile()``, naming the key and the worker.
- ``/start_profile`` and ``/stop_profile`` answer those errors with a JSON body naming them
  (HTTP 503 for a refused start, 500 for a trace not written), not vLLM's bare 500.
"""

from __future__ import annotations

import asyncio
import re
import time
from types import ModuleType
from typing import Any, Callable

from stepscope.vllm.environment import logger
from stepscope.vllm.interfaces import PATCHED_MARK, signature_known

#: The RPCs the plugin installs on vLLM's worker (see ``worker.py``).
TICKET_RPC = "stepscope_stop_ticket"
WRITES_RPC = "stepscope_writes"

#: How often the waiting stop asks the workers, s: at first, and at most.
_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.05

#: A worker's refusal as it reaches the API server (vLLM passes a worker's exception on as
#: text): "start refused by `stepscope.min_free_disk_mb`: ...".
_REFUSED = re.compile(r"start refused by `([^`]+)`: ([^'\n]*)")


def _refusal(e: BaseException) -> Exception | None:
    """A :class:`stepscope.StartRefused` for an exception that carries a worker's refusal."""
    import stepscope

    if isinstance(e, stepscope.StartRefused):
        return None
    m = _REFUSED.search(str(e))
    if m is None:
        return None
    refused = stepscope.StartRefused(f"a worker refused the start: {m.group(0)}")
    refused.key = m.group(1)
    return refused


class _Plan:
    """What one stop waits for: the workers' answers to the ticket RPC and the frontend
    profiler's ticket; then, polled, where their traces stand."""

    def __init__(self, workers: list[Any] | None, frontend: Any) -> None:
        self.workers = [w for w in (workers or []) if isinstance(w, dict) and w.get("stepscope")]
        self.frontend = frontend
        self.frontend_ticket = frontend.write_ticket() if frontend is not None else None
        self.began = 0.0
        self.poll = _POLL_FIRST_S

    @property
    def waits(self) -> bool:
        return any(w["stop_returns"] == "written" for w in self.workers) or (
            self.frontend is not None
            and self.frontend.config.get("stepscope", {}).get("stop_returns", "written")
            == "written"
        )

    @property
    def timeout_s(self) -> float:
        import stepscope

        limits = [float(w["flush_timeout_s"]) for w in self.workers]
        if self.frontend is not None:
            limits.append(self.frontend.flush_timeout_s)
        return max(limits, default=stepscope.DEFAULT_FLUSH_TIMEOUT_S)

    def begin(self) -> None:
        """The stop has reached the workers: the wait begins."""
        self.began = time.monotonic()

    def answers(self, from_workers: list[Any]) -> list[dict[str, Any]]:
        """The workers' answers to the writes RPC (those of workers without a stepscope
        profiler left out) and the frontend's."""
        answers = [a for a in from_workers if isinstance(a, dict) and a.get("stepscope")]
        if self.frontend is not None:
            writes = self.frontend.writes_since(self.frontend_ticket)
            answers.append({"stepscope": True, "worker_name": self.frontend.worker_name, **writes})
        return answers

    def next_poll(self, answers: list[dict[str, Any]]) -> float | None:
        """Seconds to wait before the next poll; None when done (settled, or out of time)."""
        settled = all(a.get("settled", True) for a in answers)
        if settled or time.monotonic() - self.began >= self.timeout_s:
            return None
        poll, self.poll = self.poll, min(self.poll * 2, _POLL_MAX_S)
        return poll

    def finish(self, answers: list[dict[str, Any]]) -> None:
        """Raises TraceNotWritten naming every trace not complete; else logs the wait."""
        import stepscope

        stepscope.check_written(((a["worker_name"], a) for a in answers), self.timeout_s)
        logger.info(
            "stepscope: the stop's %d trace(s) are on disk, %.3f s after the stop reached "
            "the workers",
            sum(len(a.get("traces", [])) for a in answers),
            time.monotonic() - self.began,
        )


def _frontend_of(engine: Any) -> Any:
    """The stepscope profiler behind the API server's CPU profiler, if it is stepscope's."""
    from stepscope.vllm.frontend import FrontendProfiler

    profiler = getattr(engine, "profiler", None)
    return profiler.profiler if isinstance(profiler, FrontendProfiler) else None


async def wait_async(engine: Any, plan: _Plan) -> None:
    """Waits until the traces the stop ended are settled, polling the workers between engine
    steps (``AsyncLLM.collective_rpc``: the event loop and the engine go on); raises
    TraceNotWritten if one is not complete or the time runs out."""
    plan.begin()
    while True:
        answers = plan.answers(await engine.collective_rpc(WRITES_RPC) if plan.workers else [])
        if (pause := plan.next_poll(answers)) is None:
            break
        await asyncio.sleep(pause)
    plan.finish(answers)


def wait_sync(collective_rpc: Callable[..., list[Any]], plan: _Plan) -> None:
    """:func:`wait_async` for the synchronous engine (``LLM``)."""
    plan.begin()
    while True:
        answers = plan.answers(collective_rpc(WRITES_RPC) if plan.workers else [])
        if (pause := plan.next_poll(answers)) is None:
            break
        time.sleep(pause)
    plan.finish(answers)


def _replace(cls: Any, replacements: dict[str, Callable[..., Any]]) -> None:
    """Puts each replacement on ``cls`` in place of the method it names, marked with it."""
    for name, new in replacements.items():
        old = getattr(cls, name)
        new.__doc__ = old.__doc__
        new.__name__ = old.__name__
        new.__qualname__ = old.__qualname__
        setattr(new, PATCHED_MARK, old)
        setattr(cls, name, new)


def _profile_methods(module: ModuleType, name: str) -> tuple[Any, Any, Any] | None:
    """``module.name`` and its ``start_profile`` and ``stop_profile``, when they are there, not
    patched yet, and the stop's signature is one the plugin knows."""
    cls = getattr(module, name, None)
    stop = getattr(cls, "stop_profile", None)
    start = getattr(cls, "start_profile", None)
    if stop is None or start is None or hasattr(stop, PATCHED_MARK):
        return None
    if not signature_known(f"{name}.stop_profile", stop, module):
        return None
    return cls, start, stop


def _patch_async_llm(module: ModuleType) -> None:
    """``AsyncLLM.start_profile`` raises StartRefused for a worker's refusal;
    ``AsyncLLM.stop_profile`` returns once the stop's traces are written."""
    found = _profile_methods(module, "AsyncLLM")
    if found is None:
        return
    cls, start, stop = found

    async def start_profile(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            await start(self, *args, **kwargs)
        except Exception as e:
            if (refused := _refusal(e)) is None:
                raise
            raise refused from e

    async def stop_profile(self: Any) -> None:
        try:
            workers = await self.collective_rpc(TICKET_RPC)
        except Exception:  # noqa: BLE001 - workers without the plugin: vLLM's stop alone
            logger.debug("stepscope: no stop tickets from the workers", exc_info=True)
            workers = None
        plan = _Plan(workers, _frontend_of(self))
        await stop(self)
        if plan.waits:
            await wait_async(self, plan)

    _replace(cls, {"start_profile": start_profile, "stop_profile": stop_profile})


def _patch_llm_engine(module: ModuleType) -> None:
    """The synchronous engine behind ``LLM``: the same contract."""
    found = _profile_methods(module, "LLMEngine")
    if found is None:
        return
    cls, start, stop = found

    def start_profile(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            start(self, *args, **kwargs)
        except Exception as e:
            if (refused := _refusal(e)) is None:
                raise
            raise refused from e

    def stop_profile(self: Any) -> None:
        try:
            workers = self.collective_rpc(TICKET_RPC)
        except Exception:  # noqa: BLE001 - workers without the plugin: vLLM's stop alone
            logger.debug("stepscope: no stop tickets from the workers", exc_info=True)
            workers = None
        plan = _Plan(workers, None)
        stop(self)
        if plan.waits:
            wait_sync(self.collective_rpc, plan)

    _replace(cls, {"start_profile": start_profile, "stop_profile": stop_profile})


def _patch_profile_router(module: ModuleType) -> None:
    """vLLM's ``/start_profile`` and ``/stop_profile`` router: the app it is attached to
    answers StartRefused with 503 and TraceNotWritten with 500, each with a JSON body naming
    the key, or the workers, files and reasons."""
    original = getattr(module, "attach_router", None)
    if original is None or hasattr(original, PATCHED_MARK):
        return

    def attach_router(app: Any) -> Any:
        result = original(app)
        try:
            _add_handlers(app)
        except Exception:  # noqa: BLE001 - vLLM's plain 500 then
            logger.debug("stepscope: no error handlers on the profile routes", exc_info=True)
        return result

    attach_router.__doc__ = original.__doc__
    setattr(attach_router, PATCHED_MARK, original)
    module.attach_router = attach_router


def _add_handlers(app: Any) -> None:
    from fastapi.responses import JSONResponse

    import stepscope

    async def refused(request: Any, e: Exception) -> Any:
        logger.warning("stepscope: %s", e)
        return JSONResponse(
            {"error": str(e), "key": getattr(e, "key", None)}, status_code=503
        )

    async def not_written(request: Any, e: Exception) -> Any:
        logger.error("stepscope: %s", e)
        return JSONResponse(
            {"error": str(e), "traces": getattr(e, "traces", [])}, status_code=500
        )

    app.add_exception_handler(stepscope.StartRefused, refused)
    app.add_exception_handler(stepscope.TraceNotWritten, not_written)
