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


@atexit.register
def _flush_at_exit() -> None:
    """Stops running sessions and waits (up to each profiler's ``flush_timeout_s``) for traces
    still being written, while the interpreter is whole: the writer threads may need it."""
    for profiler in list(_live):
        try:
            profiler.shutdown()
            if not profiler.flush():
                logger.warning(
                    "stepscope: traces of %s were still being written at exit; "
                    "their manifests say 'unfinished'",
                    profiler.worker_name,
                )
        except Exception:  # noqa: BLE001 - exit must go on
            logger.exception("stepscope: flushing %s at exit failed", profiler.worker_name)
