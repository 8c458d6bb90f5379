"""One scheduler's stepscope side: the profilers a window records with, the window running now,
what every forward batch adds, and where that state is kept (a registry of this process, not
attributes on SGLang's objects). How a window starts and stops differs between SGLang's two
profile managers: :mod:`stepscope.sglang.legacy` and :mod:`stepscope.sglang.v2`."""

from __future__ import annotations

import logging
import threading
import weakref
from pathlib import Path
from typing import Any, Callable

from stepscope.sglang.lifecycles import window_start, write_window
from stepscope.sglang.interface import sglang_version
from stepscope.sglang.merge import merge_when_written
from stepscope.sglang.model import record_model
from stepscope.sglang.naming import (
    first_rank_in_node,
    global_rank,
    is_merging_rank,
    iteration_of,
    local_rank,
    worker_name,
    world_size,
)
from stepscope.sglang.interface import reply
from stepscope.sglang.requests import KINETO_ACTIVITIES
from stepscope.sglang.status import timeline_steps

logger = logging.getLogger("stepscope.sglang")

#: The manifest key (and trace header key) of the forward pass a window began in.
FIRST_FORWARD_KEY = "sglang_first_forward_pass"

class Window:
    """The stepscope window running now, and what its stop needs."""

    def __init__(
        self, *, profile: str, profile_id: str, trace: str, output_dir: Path, merge: bool
    ) -> None:
        #: ``[prefix-]{profile_id}``: what every rank's files of this profile begin with.
        self.profile = profile
        #: This rank's file stem for the window.
        self.trace = trace
        self.profile_id = profile_id
        self.output_dir = output_dir
        self.merge = merge
        #: The request log's step at the start, where its window's log is written at the
        #: stop (beside Kineto traces, with the log on); else None.
        self.requests_since: int | None = None


class SchedulerProfiler:
    """stepscope's side of one ``SchedulerProfilerManager``: a torch profiler for the Kineto
    activities, a cuda one for ``CUDA_PROFILER``; made at the first window, remade when a
    window is made with other settings (the output directory, the activities), the old ones
    kept until their traces are written."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.profilers: list[Any] = []
        self._made_with: list[dict[str, Any]] = []
        self._retired: list[Any] = []
        #: The window running now, or None.
        self.window: Window | None = None
        #: The stages the last by-stage request chose (``profile_stages``); None: all.
        self.stages: list[str] | None = None
        #: Windows begun per profile (``merge_profiles`` waits for that many traces per rank).
        self.windows: dict[str, int] = {}
        #: Inside SGLang's ``_profile_batch_predicate``: a window begun here holds this batch.
        self.in_predicate = False
        #: The step timeline (``"stepscope": {"timeline": ...}``): a profiler of its own that
        #: steps at every forward batch, made at the first.
        self.timeline: Any = None
        self._timeline_made = False

    @property
    def active(self) -> bool:
        return self.window is not None

    # -- windows --

    def sglang_start(self, why: str, sglang_start: Callable[[], Any]) -> Any:
        import stepscope

        in_flight = stepscope.traces_in_flight()
        if in_flight:
            logger.warning(
                "stepscope: SGLang's own profiler (%s) not started: stepscope still writes %d "
                "trace(s) in this process, and Kineto is one profiler per process",
                why,
                in_flight,
            )
            return reply(False, f"stepscope still writes {in_flight} trace(s); retry")
        return sglang_start()

    def begin(
        self,
        *,
        profile: str,
        profile_id: str,
        trace: str,
        output_dir: Path,
        activities: list[str],
        with_stack: Any,
        record_shapes: Any,
        merge: bool,
    ) -> None:
        self._make_profilers(output_dir, activities, with_stack, record_shapes)
        first = int(self.manager.get_forward_ct()) + (0 if self.in_predicate else 1)
        try:
            for p in self.profilers:
                p.set_trace_name(trace)
                p.set_trace_metadata(FIRST_FORWARD_KEY, first)
                p.start()
        except Exception:
            for p in self.profilers:
                p.stop()
            raise
        self.window = Window(
            profile=profile, profile_id=profile_id, trace=trace, output_dir=output_dir, merge=merge
        )
        if any(c["profiler"] == "torch" for c in self._made_with):
            self.window.requests_since = window_start()
        self.windows[profile] = self.windows.get(profile, 0) + 1
        logger.info(
            "stepscope: profiling %s from forward pass %d into %s",
            trace,
            first,
            output_dir,
        )

    def stop_window(self) -> str:
        """Ends the running window (its trace is written in the background); returns the
        reply's message."""
        window = self.window
        assert window is not None
        for p in self.profilers:
            p.stop()
        self.window = None
        self.annotate(False)
        write_window(window.output_dir, window.trace, window.requests_since)
        logger.info("stepscope: profiling of %s stopped", window.profile)
        if window.merge and is_merging_rank():
            expected = self.windows.get(window.profile, 1) * world_size()
            threading.Thread(
                target=merge_when_written,
                name="stepscope-merge",
                args=(
                    window.output_dir,
                    window.profile,
                    window.profile_id,
                    list(self.profilers),
                    expected,
                ),
                daemon=True,
            ).start()
        return (
            f"Succeeded. stepscope writes the traces to {window.output_dir} off the scheduler "
            f"thread; each {window.profile}-*.stepscope.json says when its trace is complete, "
            f"and `stepscope wait {window.output_dir}` returns once they all are."
        )

    def _make_profilers(
        self,
        output_dir: Path,
        activities: list[str],
        with_stack: Any,
        record_shapes: Any,
    ) -> None:
        import stepscope

        from stepscope._plugin import stepscope_keys_from_env

        keys = stepscope_keys_from_env()
        wanted: list[dict[str, Any]] = []
        kineto = [KINETO_ACTIVITIES[a] for a in activities if a in KINETO_ACTIVITIES]
        # SGLang calls cudaProfilerStart on the first GPU of each node only (nsys's capture
        # range is the node's); so does stepscope.
        cuda = "CUDA_PROFILER" in activities and first_rank_in_node()
        if kineto:
            wanted.append(
                {
                    "profiler": "torch",
                    "torch_profiler_dir": str(output_dir),
                    "torch_profiler_activities": kineto,
                    "torch_profiler_with_stack": True if with_stack is None else bool(with_stack),
                    "torch_profiler_record_shapes": bool(record_shapes),
                    "torch_profiler_dump_cuda_time_total": False,
                    # With CUDA_PROFILER too, the cuda profiler's NVTX ranges are the ones.
                    "stepscope": dict(keys, **({"nvtx": "off"} if cuda else {})),
                }
            )
        if cuda:
            wanted.append({"profiler": "cuda", "stepscope": dict(keys)})
        if wanted == self._made_with:
            return
        made = [
            stepscope.WorkerProfiler(
                c,
                worker_name=worker_name(),
                local_rank=local_rank(),
                rank=global_rank(),
            )
            for c in wanted
        ]
        for p in made:
            p.set_trace_metadata("sglang_version", sglang_version())
        self._retire()
        self.profilers, self._made_with = made, wanted

    def _retire(self) -> None:
        """Keeps the old profilers until their traces are written (dropping one waits for
        them, which the scheduler must not)."""
        self._retired.extend(self.profilers)
        self._retired = [p for p in self._retired if p.pending_writes]
        self.profilers = []

    def annotate(self, on: bool) -> None:
        apply = getattr(self.manager, "_apply_detailed_annotations", None)
        if apply is not None:
            apply(on)

    # -- forward batches --

    def time_batch(self, batch: Any) -> None:
        """One step of the timeline per forward batch. SGLang has no call at a batch's end, so
        a step lasts until the next batch's predicate: the scheduler loop's period, batch and
        scheduling together."""
        if not self._timeline_made:
            self._timeline_made = True
            steps = timeline_steps()
            if steps is None:
                return
            import stepscope

            self.timeline = stepscope.WorkerProfiler(
                {"stepscope": {"timeline": steps}},
                worker_name=worker_name(),
                local_rank=local_rank(),
                rank=global_rank(),
            )
        if self.timeline is not None:
            self.timeline.step(iteration_of(batch))

    def on_batch(self, batch: Any) -> None:
        """One ``step()`` of the running window: the batch's counts, each request's tokens,
        phase and computed tokens (and, with ``stepscope.request_ids``, their ``rid`` s)."""
        ids = [str(r.rid) for r in batch.reqs] if self._wants_ids() else None
        # Each request's counts always (the core sums the step's work), the model once.
        record_model(batch, self.profilers)
        iteration = iteration_of(batch, ids, shares=True)
        for p in self.profilers:
            p.step(iteration)

    def _wants_ids(self) -> bool:
        return any(p.wants_request_ids for p in self.profilers)


#: Each scheduler's state, by the ``id`` of its ``SchedulerProfilerManager`` (one per scheduler
#: process; SGLang's managers are not hashable), with a weak reference to it that drops the
#: entry when the manager goes.
_states: dict[int, tuple[Callable[[], Any], SchedulerProfiler]] = {}


def _holder(manager: Any) -> Callable[[], Any]:
    key = id(manager)
    try:
        return weakref.ref(manager, lambda _: _states.pop(key, None))
    except TypeError:  # not weakly referable: held as long as the process
        return lambda: manager


def state_of(manager: Any) -> SchedulerProfiler:
    """The scheduler's state, made at its first use."""
    state = found(manager)
    if state is None:
        state = SchedulerProfiler(manager)
        _states[id(manager)] = (_holder(manager), state)
    return state


def found(manager: Any) -> SchedulerProfiler | None:
    """The scheduler's state, or None before the plugin served it."""
    entry = _states.get(id(manager)) if manager is not None else None
    return entry[1] if entry is not None and entry[0]() is manager else None


def found_for_v2(v2: Any) -> SchedulerProfiler | None:
    """The state of the scheduler whose V2 ``ProfileManager`` is ``v2``."""
    for _, state in list(_states.values()):
        if getattr(state.manager, "_profile_manager", None) is v2:
            return state
    return None
