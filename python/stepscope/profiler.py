"""``stepscope.WorkerProfiler``: the native profiler with vLLM's drop-in methods that live in
Python (``start`` adding torch.distributed's header, ``set_profiler_kwargs``,
``annotate_context_manager``, ``wait_written``, ``shutdown`` waiting for traces), and the
process's exit hooks that write the traces of profilers still alive."""

from __future__ import annotations

import atexit
import json
import logging
import multiprocessing.util
import weakref
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Mapping, Union

from stepscope._native import TIMELINE_FIELDS, BackendError, ConfigError, kineto_glue
from stepscope._native import WorkerProfiler as _NativeWorkerProfiler
from stepscope.writes import check_written

logger = logging.getLogger("stepscope")

ConfigLike = Union[Mapping[str, Any], str, "os.PathLike[str]"]  # noqa: F821

# torch.profiler.profile keyword -> config field, for set_profiler_kwargs (a dotted field is
# under "stepscope").
_PROFILER_KWARGS = {
    "activities": "torch_profiler_activities",
    "record_shapes": "torch_profiler_record_shapes",
    "profile_memory": "torch_profiler_with_memory",
    "with_stack": "torch_profiler_with_stack",
    "with_flops": "torch_profiler_with_flops",
    "with_modules": "stepscope.torch_with_modules",
}
# torch.profiler.profile keywords with no Kineto C++ counterpart here, and why: logged once
# each, never raised (vLLM 0.33 passes /start_profile's profiler_kwargs through).
_NOT_APPLIED = {
    "schedule": "stepscope follows vLLM's wait/warmup/active iterations",
    "on_trace_ready": "stepscope writes the trace itself, off the engine thread",
    "acc_events": "each stepscope session writes its own trace",
    "experimental_config": "torch's _ExperimentalConfig is not passed to Kineto by stepscope "
    "(stepscope sets its trace_only itself where nothing reads torch's event list)",
    "execution_trace_observer": "execution traces are not collected by stepscope",
    "custom_trace_id_callback": "stepscope makes the trace id",
    "use_cuda": "deprecated in torch; name CUDA in activities",
    "post_processing_timeout_s": "stepscope's writer is bounded by stepscope.flush_timeout_s",
}
_logged_not_applied: set[str] = set()


def torch_backend_error() -> str | None:
    """Why ``"profiler": "torch"`` cannot run in this process (no torch, or no Kineto glue for
    the torch imported: the message names the torch found and the versions there is glue
    for), or None when it can. Imports torch when it is installed and not yet imported."""
    try:
        import torch  # noqa: F401 - loads libtorch, which the glue links
    except ImportError as e:
        return f"torch is not installed ({e})"
    try:
        kineto_glue()
    except BackendError as e:
        return str(e)
    return None

# Profilers still alive at interpreter exit get their traces written first (see _flush_at_exit).
_live: "weakref.WeakSet[WorkerProfiler]" = weakref.WeakSet()


class WorkerProfiler(_NativeWorkerProfiler):
    """vLLM's ``WorkerProfiler`` (0.32/0.33 API), natively: delay/max with the ``> N`` cutoff,
    warmup, per-session overrides, auto-stop; NVTX ranges with request and token counts; torch
    traces written off the engine thread.

    ``config`` is vLLM's ``--profiler-config`` as a dict, JSON text, or a path to a JSON file,
    plus stepscope's own keys under ``"stepscope"``. A bad config raises :class:`ConfigError`
    naming the field. Backend failures in ``start``/``step``/``stop`` are logged on the
    ``stepscope`` logger and never raise into the engine loop, as in vLLM. A ``start`` that a
    capture limit refuses (``stepscope.min_free_disk_mb``, ``max_capture_mb``) raises
    :class:`StartRefused` naming the key: nothing was armed, and its caller (a control call,
    not the engine loop) must know.

    ``stop()`` returns at once; the trace is written on stepscope's threads. A caller that
    must return only once the files are there takes :meth:`write_ticket` before the stop and
    then :meth:`wait_written` (or polls :meth:`writes_since`), as the vLLM plugin's stop does.
    """

    def __init__(
        self,
        config: ConfigLike,
        worker_name: str,
        local_rank: int = 0,
        rank: int | None = None,
    ) -> None:
        # The native __new__ parsed the config, made the backend and took the rank (the global
        # one, for "stepscope": {"ranks": [...]}; default: the RANK environment variable). The
        # config stays there: ``config_json``, ``base_config_json``, ``flush_timeout_s``.
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
        if not self.is_active and self.config.get("profiler") == "torch":
            # Kineto's glue links libtorch: it must be loaded before the first capture.
            import torch  # noqa: F401

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

    def set_model(
        self,
        config: Mapping[str, Any] | str,
        *,
        tensor_parallel: int | None = None,
        weight_dtype: str | None = None,
        kv_cache_dtype: str | None = None,
        params: int | None = None,
    ) -> dict[str, Any]:
        """Records the served model's shape in the header and manifest of the traces written
        from now on, for ``stepscope analyze``'s floor of each step: ``config`` is its Hugging
        Face config (a mapping, or ``config.json``'s text), read in Rust; the rest is what only
        the engine knows. Returns the shape recorded (what could not be told is listed in its
        ``unknown``)."""
        text = config if isinstance(config, str) else json.dumps(dict(config), default=str)
        return self._set_model(
            text,
            tensor_parallel=tensor_parallel,
            weight_dtype=weight_dtype,
            kv_cache_dtype=kv_cache_dtype,
            params=params,
        )

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
                self.flush_timeout_s,
            )

    def wait_written(self, ticket: int, timeout: float | None = None) -> dict[str, Any]:
        """Waits (up to ``timeout`` s, default ``stepscope.flush_timeout_s``) until the traces
        since ``ticket`` are settled (see :meth:`writes_since`) and returns where they stand.
        Raises :class:`TraceNotWritten` naming the worker, each trace and why when one failed
        or the time ran out. Call it from the thread that waits, never the engine thread
        while a stop is pending there."""
        import time

        limit = self.flush_timeout_s if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        while True:
            writes = self.writes_since(ticket)
            if writes["settled"] or time.monotonic() >= deadline:
                break
            self.flush(min(0.05, max(0.0, deadline - time.monotonic())))
        check_written([(self.worker_name, writes)], limit)
        return writes

    def timeline_dicts(self, since: int = 0) -> list[dict[str, Any]] | None:
        """:meth:`timeline` as dicts keyed by :data:`TIMELINE_FIELDS`; ``None`` when the
        timeline is off."""
        steps = self.timeline(since)
        if steps is None:
            return None
        return [dict(zip(TIMELINE_FIELDS, s, strict=True)) for s in steps]

    def annotate_context_manager(self, name: str) -> AbstractContextManager[Any]:
        """A context manager annotating a region with ``name`` while capturing (vLLM's).

        Engines that pass an :class:`Iteration` to :meth:`step` already get each iteration
        annotated; this is for regions the engine names itself.
        """
        if not self.should_annotate:
            return nullcontext()
        kind = self.config.get("profiler")
        if kind not in ("torch", "cuda"):
            return nullcontext()
        try:
            import torch

            if kind == "torch":
                return torch.profiler.record_function(name)
            return torch.cuda.nvtx.range(name)
        except (ImportError, AttributeError, RuntimeError):  # no torch, or one without CUDA
            return nullcontext()

    def set_profiler_kwargs(self, kwargs: Mapping[str, Any] | None) -> None:
        """``torch.profiler.profile`` arguments for the next session, over the profiler's own
        config, as vLLM 0.33's: each call starts again from that config, so ``None`` (or
        ``{}``) goes back to it. Applied: ``activities``, ``record_shapes``,
        ``profile_memory``, ``with_stack``, ``with_flops``, ``with_modules``. Any other key
        (``acc_events``, ``experimental_config``, ...), or a value that cannot apply, is logged
        once as not applied; nothing raises. Ignored while a session is active."""
        updated = self.base_config
        for key, value in (kwargs or {}).items():
            field = _PROFILER_KWARGS.get(key)
            if field is None:
                _log_not_applied(key, _NOT_APPLIED.get(key, "not a torch.profiler.profile "
                                                      "argument stepscope knows"))
                continue
            if key == "activities":
                try:
                    value = None if value is None else [_activity_name(a) for a in value]
                except (TypeError, ValueError) as e:
                    _log_not_applied(key, str(e))
                    continue
            elif not isinstance(value, bool):
                _log_not_applied(key, f"must be true or false, not {value!r}")
                continue
            section, _, name = field.rpartition(".")
            (updated.setdefault(section, {}) if section else updated)[name] = value
        if self.is_active:
            logger.info("set_profiler_kwargs ignored: a profiling session is active")
            return
        try:
            applied = self._reconfigure(updated)
        except ConfigError as e:
            logger.warning("stepscope: profiler_kwargs not applied: %s", e)
            return
        if not applied:
            logger.info("set_profiler_kwargs ignored: a profiling session is active")

    @property
    def has_cuda_graph_session(self) -> bool:
        """vLLM's: no backend here keeps a session across CUDA graph capture."""
        return False

    def capture_cuda_graphs(self) -> AbstractContextManager[None]:
        """vLLM's hook around CUDA graph capture; nothing to observe for these backends."""
        return nullcontext()


def _log_not_applied(key: str, why: str) -> None:
    if key in _logged_not_applied:
        return
    _logged_not_applied.add(key)
    logger.warning("stepscope: profiler_kwargs %r not applied: %s", key, why)


def _activity_name(activity: Any) -> str:
    """``"CPU"`` or a ``torch.profiler.ProfilerActivity`` -> the config's activity name."""
    name = activity if isinstance(activity, str) else getattr(activity, "name", None)
    if name in ("CPU", "CUDA", "XPU", "PrivateUse1"):
        return name
    raise ValueError(f"unsupported activity {activity!r} (CPU, CUDA, XPU, PrivateUse1)")


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
            import torch

            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        json.dumps(info)
        return info
    except Exception:  # noqa: BLE001 - metadata is optional; the capture goes on
        logger.debug("stepscope: no distributedInfo for the trace header", exc_info=True)
        return None


def traces_in_flight() -> int:
    """Traces this process's live profilers have stopped and not yet written (finalizing,
    queued or being written): while any is, Kineto is still busy with them, and another
    profiler of this process (torch.profiler, an engine's own) must not start."""
    return sum(p.pending_writes for p in list(_live))


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
