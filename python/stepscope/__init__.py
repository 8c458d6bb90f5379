"""stepscope: profile a few chosen engine iterations, from every worker, without stalling it.

A drop-in for vLLM's ``WorkerProfiler`` (same methods, same delay/max semantics), driven by one
``step()`` per engine iteration::

    import stepscope

    profiler = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": "/tmp/traces",
         "delay_iterations": 10, "max_iterations": 3},
        worker_name="rank0",
    )
    profiler.start()
    for batch in engine:
        profiler.step(stepscope.Iteration(num_ctx_reqs=1, num_ctx_tokens=512,
                                          num_gen_reqs=31, num_gen_tokens=31))
        run_model(batch)
        profiler.step_end()
    profiler.stop()          # returns at once; the trace is written in the background
    profiler.flush()         # optional: wait for it

Inside vLLM nothing changes: the plugin (``stepscope.vllm``) makes vLLM's own
``--profiler-config`` create stepscope's profiler. See docs/vllm.md.
"""

from __future__ import annotations

import atexit
import json
import logging
import multiprocessing.util
import os
import weakref
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Mapping, Union

# The extension links libtorch: importing torch first loads it (the extension then finds it by
# soname wherever it is installed) and registers Kineto's Python tracer for with_stack.
import torch

from stepscope._native import BackendError, ConfigError, Iteration, __version__
from stepscope._native import WorkerProfiler as _NativeWorkerProfiler

__all__ = [
    "BackendError",
    "ConfigError",
    "Iteration",
    "WorkerProfiler",
    "__version__",
]

logger = logging.getLogger("stepscope")

ConfigLike = Union[Mapping[str, Any], str, "os.PathLike[str]"]

# torch.profiler.profile keyword -> config field, for set_profiler_kwargs.
_PROFILER_KWARGS = {
    "activities": "torch_profiler_activities",
    "record_shapes": "torch_profiler_record_shapes",
    "profile_memory": "torch_profiler_with_memory",
    "with_stack": "torch_profiler_with_stack",
    "with_flops": "torch_profiler_with_flops",
}

# Profilers still alive at interpreter exit get their traces written first (see _flush_at_exit).
_live: "weakref.WeakSet[WorkerProfiler]" = weakref.WeakSet()


class WorkerProfiler(_NativeWorkerProfiler):
    """vLLM's ``WorkerProfiler`` (0.32/0.33 API), natively: delay/max with the ``> N`` cutoff,
    warmup, per-session overrides, auto-stop; NVTX ranges with request and token counts; torch
    traces written off the engine thread.

    ``config`` is vLLM's ``--profiler-config`` as a dict, JSON text, or a path to a JSON file,
    plus stepscope's own keys under ``"stepscope"``. A bad config raises :class:`ConfigError`
    naming the field. Backend failures in ``start``/``step``/``stop`` are logged on the
    ``stepscope`` logger and never raise into the engine loop, as in vLLM.
    """

    def __init__(
        self,
        config: ConfigLike,
        worker_name: str,
        local_rank: int = 0,
        rank: int | None = None,
    ) -> None:
        # The native __new__ parsed the config, made the backend and took the rank (the global
        # one, for "stepscope": {"ranks": [...]}; default: the RANK environment variable).
        self._config: dict[str, Any] = json.loads(self.config_json)
        _live.add(self)

    def start(
        self,
        *,
        delay_iterations: int | None = None,
        max_iterations: int | None = None,
        start_at_step: int | None = None,
    ) -> None:
        """Starts a session; the overrides hold for this session only (see the native docs).
        With the torch backend, the traces carry ``distributedInfo`` (backend, rank, world
        size, process groups) as torch's own profiler writes it, when torch.distributed is
        initialized."""
        if self._config.get("profiler") == "torch" and not self.is_active:
            info = _distributed_info()
            if info is not None:
                self.set_trace_metadata("distributedInfo", info)
        super().start(
            delay_iterations=delay_iterations,
            max_iterations=max_iterations,
            start_at_step=start_at_step,
        )

    def set_trace_metadata(self, key: str, value: Any) -> None:
        """Adds ``key`` to the header of the traces written from now on (torch's
        ``add_metadata_json``); ``value`` is anything ``json.dumps`` takes. A key given again
        is replaced. Only the torch backend writes traces; the others ignore it."""
        self._set_trace_metadata_json(key, json.dumps(value))

    def shutdown(self) -> None:
        """The engine loop has ended (vLLM's ``shutdown()``): stops a running session, then
        waits, up to ``stepscope.flush_timeout_s``, for traces still being written, as vLLM's
        own profiler writes its trace before shutdown returns. While traces are in flight a
        marker file (:func:`flushing_marker`) tells a parent process manager (the vLLM
        plugin's) to give this process the time."""
        super().shutdown()
        if self.pending_writes and not self.flush():
            logger.warning(
                "stepscope: traces of %s were still being written after %ss "
                "(stepscope.flush_timeout_s); their manifests say 'unfinished' when the "
                "process ends",
                self.worker_name,
                self._flush_timeout_s(),
            )

    def _flush_timeout_s(self) -> float:
        return float(self._config.get("stepscope", {}).get("flush_timeout_s", 600.0))

    def status(self) -> dict[str, Any]:
        """The profiler's state: ``phase``, ``step_index``, the session's limits and start step,
        ``window_first_step``, ``iterations_captured``, ``windows``/``windows_done``/
        ``next_window_at`` (``repeat``), ``pending_writes``, ``rank``/``selected`` and
        ``last_error``."""
        return json.loads(self.status_json())

    def annotate_context_manager(self, name: str) -> AbstractContextManager[Any]:
        """A context manager annotating a region with ``name`` while capturing (vLLM's).

        Engines that pass an :class:`Iteration` to :meth:`step` already get each iteration
        annotated; this is for regions the engine names itself.
        """
        if not self.should_annotate:
            return nullcontext()
        kind = self._config.get("profiler")
        if kind == "torch":
            return torch.profiler.record_function(name)
        if kind == "cuda":
            try:
                return torch.cuda.nvtx.range(name)
            except (AttributeError, RuntimeError):  # a torch built without CUDA
                return nullcontext()
        return nullcontext()

    def set_profiler_kwargs(self, kwargs: Mapping[str, Any]) -> None:
        """Sets ``torch.profiler.profile`` options for the next session: ``activities``,
        ``record_shapes``, ``profile_memory``, ``with_stack``, ``with_flops``. Ignored (with a
        log line) while a session is active; an unknown key raises ``ValueError``."""
        updated = dict(self._config)
        for key, value in kwargs.items():
            field = _PROFILER_KWARGS.get(key)
            if field is None:
                raise ValueError(
                    f"set_profiler_kwargs: unknown key {key!r}; "
                    f"supported: {', '.join(sorted(_PROFILER_KWARGS))}"
                )
            if key == "activities" and value is not None:
                value = [_activity_name(a) for a in value]
            updated[field] = value
        if self._reconfigure(updated):
            self._config = updated
        else:
            logger.info("set_profiler_kwargs ignored: a profiling session is active")

    @property
    def has_cuda_graph_session(self) -> bool:
        """vLLM's: no backend here keeps a session across CUDA graph capture."""
        return False

    def capture_cuda_graphs(self) -> AbstractContextManager[None]:
        """vLLM's hook around CUDA graph capture; nothing to observe for these backends."""
        return nullcontext()


def _activity_name(activity: Any) -> str:
    """``"CPU"`` or a ``torch.profiler.ProfilerActivity`` -> the config's activity name."""
    if isinstance(activity, str):
        return activity
    name = getattr(activity, "name", None)
    if name in ("CPU", "CUDA", "XPU", "PrivateUse1"):
        return name
    raise ValueError(f"set_profiler_kwargs: unsupported activity {activity!r}")


def _distributed_info() -> dict[str, Any] | None:
    """torch.distributed's state as torch's profiler puts it in a trace header
    (``distributedInfo``), or None when it is not initialized."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        backend = dist.get_backend()
        info: dict[str, Any] = {
            "backend": backend,
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "pg_count": dist.get_pg_count(),
            "pg_config": dist.distributed_c10d._get_all_pg_configs(),
        }
        if backend == "nccl":
            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        json.dumps(info)
        return info
    except Exception:  # noqa: BLE001 - metadata is optional; the capture goes on
        logger.debug("stepscope: no distributedInfo for the trace header", exc_info=True)
        return None


def flushing_marker(pid: int) -> str:
    """The file that says process ``pid`` has traces being finalized or written:
    ``$TMPDIR/stepscope-flushing-{pid}`` (``/tmp`` when TMPDIR is unset), holding the longest
    flush timeout (``stepscope.flush_timeout_s``) of its writers in seconds. The library keeps
    it while a trace is in flight. A process manager that would kill the process after a short
    grace period can wait while the marker is there, up to that many seconds (the vLLM plugin
    does)."""
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", f"stepscope-flushing-{pid}")


def _flush_at_exit() -> None:
    """Stops running sessions and waits (up to each profiler's ``flush_timeout_s``) for traces
    still being written, while the interpreter is whole: the writer threads may need it."""
    for profiler in list(_live):
        try:
            profiler.shutdown()
        except Exception:  # noqa: BLE001 - exit must go on
            logger.exception("stepscope: flushing %s at exit failed", profiler.worker_name)


# A normal interpreter exit runs atexit; a multiprocessing child (vLLM's engine and worker
# processes) ends with os._exit after multiprocessing's own exit hooks, which run this too.
atexit.register(_flush_at_exit)
multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=100)
