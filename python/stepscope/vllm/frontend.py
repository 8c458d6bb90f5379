"""The API server's CPU profiler (vLLM's ``create_frontend_profiler``, used while
``ignore_frontend`` is false), as stepscope's: started and stopped on a thread of its own,
written in the background, stopped and written at exit if nobody stopped it."""

from __future__ import annotations

import atexit
import concurrent.futures
import threading
import weakref
from typing import Any, Callable

from stepscope.vllm.config import add_version_metadata, config_dict, make_with_known_fields
from stepscope.vllm.environment import logger

#: Capture-control keys mean nothing to the frontend, which has no engine iterations.
_ITERATION_KEYS = ("ranks", "start_at_step", "stages", "repeat", "repeat_every",
                   "min_batch_requests", "min_batch_tokens")


class _OwnThread:
    """One daemon thread running the calls given to :meth:`run`, one at a time. Not a
    ThreadPoolExecutor: an executor refuses work once the interpreter begins to exit, before
    ``atexit`` handlers run, and Kineto's session must be stopped on the thread that began it."""

    def __init__(self, name: str) -> None:
        import queue

        self._calls: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.Queue()
        )
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, future = self._calls.get()
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)

    def run(self, fn: Callable[[], Any]) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._calls.put((fn, future))
        return future.result()


class FrontendProfiler:
    """The API server's CPU profiler around ``AsyncLLM`` (vLLM's ``create_frontend_profiler``,
    used while ``ignore_frontend`` is false), as stepscope's: ``stop()`` returns once Kineto has
    let go of the session, and the trace is written in the background.

    vLLM calls ``start``/``stop`` through ``asyncio.to_thread``, so on any thread of a pool;
    Kineto's session belongs to the thread that enabled it. Both run here on one thread of
    this profiler's own.
    """

    def __init__(self, profiler_config: Any, worker_name: str) -> None:
        import stepscope

        config = config_dict(profiler_config)
        config.update(
            delay_iterations=0,
            max_iterations=0,
            wait_iterations=0,
            warmup_iterations=0,
            torch_profiler_activities=["CPU"],
        )
        keys = {k: v for k, v in config.get("stepscope", {}).items() if k not in _ITERATION_KEYS}
        config["stepscope"] = keys
        self._profiler = make_with_known_fields(
            profiler_config,
            config,
            lambda c: stepscope.WorkerProfiler(c, worker_name=worker_name),
        )
        add_version_metadata(self._profiler)
        self._thread = _OwnThread("stepscope-frontend")
        # A session still running when the API server exits (a /start_profile nobody stopped)
        # is stopped and written first: torch's profiler state destroyed at exit with its
        # session on crashed the process (segfault in ~ProfilerStateBase).
        ref = weakref.ref(self)
        atexit.register(lambda: (p := ref()) is not None and p._at_exit())
        logger.info(
            "stepscope: the API server's CPU trace is stepscope's (written off the request "
            "path) under %s",
            profiler_config.torch_profiler_dir,
        )

    def _on_thread(self, fn: Callable[[], Any]) -> Any:
        return self._thread.run(fn)

    def _at_exit(self) -> None:
        try:
            if self._profiler.is_active:
                logger.info("stepscope: the API server exits with its profile running: stopped")
            self._on_thread(self._profiler.shutdown)
        except Exception:  # noqa: BLE001 - exiting anyway
            logger.debug("stepscope: the frontend's shutdown at exit failed", exc_info=True)

    def start(self) -> None:
        self._on_thread(self._profiler.start)

    def stop(self) -> None:
        self._on_thread(self._profiler.stop)

    def shutdown(self) -> None:
        self._on_thread(self._profiler.shutdown)

    def set_output_name(self, worker_name: str) -> None:
        self._profiler.set_output_name(worker_name)

    @property
    def profiler(self) -> Any:
        """The stepscope profiler behind it."""
        return self._profiler

    def __getattr__(self, name: str) -> Any:
        # Anything else vLLM may read (is_running, should_annotate, ...) is the profiler's.
        return getattr(self._profiler, name)
