"""SGLang's newer profile manager (``SGLANG_PROFILE_V2``'s ``ProfileManager``): windows by
stage only, started and stopped in ``_do_start``/``_do_stop``; its manual stop raises, so
``/stop_profile`` is served here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from stepscope.sglang.interface import reply
from stepscope.sglang.naming import DEFAULT_ACTIVITIES, profile_name, trace_stem
from stepscope.sglang.requests import cannot_serve
from stepscope.sglang.window import SchedulerProfiler


class V2:
    """How a window starts and stops under ``SGLANG_PROFILE_V2``."""

    v2 = True

    def stop_request(self, state: SchedulerProfiler) -> Any:
        """``/stop_profile`` under V2 (whose manual stop raises NotImplementedError): ends the
        running stage window and drops the stages still to come."""
        v2 = getattr(state.manager, "_profile_manager", None)
        trigger = getattr(v2, "stage_based_trigger", None)
        pending = list(getattr(trigger, "stage_configs", {}) or {})
        if trigger is not None:
            trigger.running_state = None
            trigger.stage_configs = {}
        if state.active:
            return reply(True, state.stop_window())
        if pending:
            return reply(True, f"Succeeded. No window was running; {', '.join(pending)} dropped.")
        return reply(False, "Profiling is not in progress. Call /start_profile first.")

    def start_request(self, state: SchedulerProfiler, req: Any) -> Any:
        """V2's configure asserts that no stage window runs: refused while one does."""
        if state.active:
            return reply(False, "Profiling is already in progress. Call /stop_profile first.")
        return None

    def requested(self, state: SchedulerProfiler, req: Any, answer: Any) -> None:
        """Nothing to keep: V2 starts each stage's window itself."""

    def start(
        self, state: SchedulerProfiler, v2: Any, stage: Any, sglang_start: Callable[[], Any]
    ) -> None:
        """V2's ``_do_start(stage)`` with a stepscope window."""
        kw = v2.profiler_kwargs
        activities = list(kw["activities"] or DEFAULT_ACTIVITIES)
        why = cannot_serve(activities)
        if why is not None:
            state.sglang_start(why, sglang_start)
            return
        profile = profile_name(kw["output_prefix"], kw["profile_id"])
        state.begin(
            profile=profile,
            profile_id=str(kw["profile_id"]),
            trace=trace_stem(profile) + (f"-{stage}" if stage else ""),
            output_dir=Path(kw["output_dir"]).expanduser(),
            activities=activities,
            with_stack=kw["with_stack"],
            record_shapes=kw["record_shapes"],
            merge=False,
        )
        state.annotate(bool(v2.detailed_annotations))

    def stop(self, state: SchedulerProfiler) -> None:
        """V2's ``_do_stop`` for stepscope's window."""
        state.stop_window()
