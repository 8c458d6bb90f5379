"""The engine worker, patched: ``Worker.annotate_profile`` hands each iteration's counts (and
requests) to stepscope's profiler, made at the first step when the step timeline is on; the
worker gets the ``collective_rpc`` handlers of ``stepscope.vllm.rpc``."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from types import ModuleType
from typing import Any, Callable

from stepscope.vllm.environment import key_on, logger, warn_once
from stepscope.vllm.factory import make_factory
from stepscope.vllm.interfaces import PATCHED_MARK, WRAPPER, signature_known, warn_unpatched
from stepscope.vllm.model import record_model
from stepscope.vllm.rpc import worker_status, worker_stop_ticket, worker_timeline, worker_writes
from stepscope.vllm.scheduled import iteration_of

def _patch_gpu_worker(module: ModuleType) -> None:
    worker = getattr(module, "Worker", None)
    original_annotate = getattr(worker, "annotate_profile", None)
    factory = getattr(module, "create_worker_profiler", None)
    try:
        from vllm.v1.utils import compute_iteration_details
    except ImportError:
        compute_iteration_details = None
    missing = [
        name
        for name, found in (
            ("Worker.annotate_profile", original_annotate),
            ("create_worker_profiler", factory),
            ("vllm.v1.utils.compute_iteration_details", compute_iteration_details),
        )
        if found is None
    ]
    if missing:
        warn_unpatched(module, ", ".join(missing))
        return
    # How the worker drives its profiler (profile) and hands it iterations (annotate_profile)
    # must be as the plugin knows it; the factory it calls too.
    if not all(
        hasattr(fn, PATCHED_MARK) or signature_known(name, fn, module)
        for name, fn in (
            ("Worker.profile", getattr(worker, "profile", None)),
            ("Worker.annotate_profile", original_annotate),
            ("create_worker_profiler", factory),
        )
    ):
        return
    if not hasattr(factory, PATCHED_MARK):
        # gpu_worker imported the factory by name before the wrapper module was patched.
        wrapper = sys.modules.get(WRAPPER)
        patched = getattr(wrapper, "create_worker_profiler", None)
        module.create_worker_profiler = (
            patched if hasattr(patched, PATCHED_MARK) else make_factory(factory)
        )
    if not hasattr(original_annotate, PATCHED_MARK):
        worker.annotate_profile = _make_annotate(
            original_annotate, compute_iteration_details, module
        )
    if not hasattr(worker, "stepscope_status"):
        worker.stepscope_status = worker_status
    if not hasattr(worker, "stepscope_timeline"):
        worker.stepscope_timeline = worker_timeline
    if not hasattr(worker, "stepscope_stop_ticket"):
        worker.stepscope_stop_ticket = worker_stop_ticket
        worker.stepscope_writes = worker_writes


def _make_annotate(
    original: Callable[..., Any], compute_iteration_details: Any, module: ModuleType
) -> Callable[..., Any]:
    import stepscope

    def annotate_profile(self: Any, scheduler_output: Any) -> Any:
        profiler = getattr(self, "profiler", None)
        if profiler is None and timeline_wanted():
            profiler = _timeline_profiler(self, module)
        if not isinstance(profiler, stepscope.WorkerProfiler):
            return original(self, scheduler_output)
        if not profiler.is_armed:
            if not profiler.has_timeline:
                # Nothing will read counts: skip computing them (vLLM's idle cost).
                profiler.step()
                return _IDLE
            # The timeline keeps the counts and times the step until the scope exits.
            profiler.step(counted(scheduler_output))
            return _IterationScope(profiler)
        # Armed: each request's counts (the step's work, summed by the core), their ids only
        # when stepscope.request_ids asks for them, and the model's shape once.
        record_model(self, profiler)
        profiler.step(counted(scheduler_output, armed=profiler.wants_request_ids))
        return _IterationScope(profiler)

    def counted(scheduler_output: Any, armed: bool | None = None) -> Any:
        """The step's iteration; a ``SchedulerOutput`` the plugin cannot read (another
        vLLM) gives a step of unknown counts, logged once: never an error in the engine."""
        try:
            if armed is None:
                return iteration_of(scheduler_output, compute_iteration_details)
            return iteration_of(
                scheduler_output, compute_iteration_details, shares=True, ids=armed
            )
        except Exception as e:  # noqa: BLE001 - the engine loop goes on
            warn_once("annotate", "stepscope: a step's counts could not be read: %r", e)
            return None

    annotate_profile.__doc__ = original.__doc__
    annotate_profile.__name__ = "annotate_profile"
    annotate_profile.__qualname__ = getattr(original, "__qualname__", "annotate_profile")
    setattr(annotate_profile, PATCHED_MARK, original)
    return annotate_profile


def timeline_wanted() -> bool:
    """``"stepscope": {"timeline": ...}`` is set (and not false) in ``STEPSCOPE_CONFIG``."""
    return key_on("timeline")


def _timeline_profiler(worker: Any, module: ModuleType) -> Any:
    """The worker's profiler, made at its first step rather than at its first
    ``/start_profile``, so that the timeline covers every step; ``None`` when vLLM's config
    names no profiler stepscope serves, or making it failed (then not tried again). vLLM's
    ``profile()`` uses it as its own, since it makes one only when there is none."""
    if getattr(worker, "_stepscope_timeline_tried", False):
        return None
    worker._stepscope_timeline_tried = True
    config = getattr(worker, "profiler_config", None)
    if getattr(config, "profiler", None) not in ("torch", "cuda"):
        return None
    # The factory Worker.profile() calls (the plugin's, patched into gpu_worker).
    factory = getattr(module, "create_worker_profiler", None)
    if not hasattr(factory, PATCHED_MARK):
        return None
    try:
        from vllm.distributed.utils import get_worker_rank_suffix

        name = get_worker_rank_suffix(global_rank=worker.rank)
    except Exception:  # noqa: BLE001 - an older vLLM: the rank alone
        name = f"rank{getattr(worker, 'rank', 0)}"
    try:
        profiler = factory(config, worker_name=name, local_rank=getattr(worker, "local_rank", 0))
    except Exception as e:  # noqa: BLE001 - never into the engine loop
        logger.warning("stepscope: the step timeline is off on %s: %s", name, e)
        return None
    worker.profiler = profiler
    logger.info("stepscope: step timeline on for %s", name)
    return profiler


# nullcontext keeps no state, so one serves every idle iteration.
_IDLE = nullcontext()


class _IterationScope:
    """Closes the iteration's NVTX range and Kineto annotation when the model step ends."""

    __slots__ = ("_profiler",)

    def __init__(self, profiler: Any) -> None:
        self._profiler = profiler

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._profiler.step_end()
