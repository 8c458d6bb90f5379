"""SGLang's default profile manager (``SchedulerProfilerManager``): it decides when a window
begins and ends (``start_step``, ``num_steps``, by stage) and calls ``_start_profile`` and
``_stop_profile``, where a stepscope window takes torch.profiler's place."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from stepscope.sglang.interface import reply
from stepscope.sglang.naming import (
    DEFAULT_ACTIVITIES,
    legacy_stage_suffix,
    profile_name,
    stage_of,
    trace_stem,
)
from stepscope.sglang.requests import cannot_serve
from stepscope.sglang.window import SchedulerProfiler

logger = logging.getLogger("stepscope.sglang")


class Legacy:
    """How a window starts and stops under SGLang's default profile manager."""

    #: Not SGLANG_PROFILE_V2.
    v2 = False

    def stop_request(self, state: SchedulerProfiler) -> Any:
        """``/stop_profile``: SGLang's own code takes it, and its ``_stop_profile`` ends the
        window."""
        return None

    def start_request(self, state: SchedulerProfiler, req: Any) -> Any:
        """A start stepscope serves: what SGLang does with ``start_step`` is said, and SGLang's
        own code takes it."""
        forward_ct = int(state.manager.get_forward_ct())
        if req.start_step and not req.profile_by_stage and req.start_step <= forward_ct:
            logger.info(
                "stepscope: start_step %d has passed on this rank (forward pass %d): as SGLang "
                "does, the window begins in the next forward pass, %d",
                req.start_step,
                forward_ct,
                forward_ct + 1,
            )
        if req.start_step and req.profile_by_stage:
            logger.info(
                "stepscope: start_step %d is not used by profile_by_stage (SGLang's windows "
                "begin at the first batch of each stage)",
                req.start_step,
            )
        return None

    def requested(self, state: SchedulerProfiler, req: Any, answer: Any) -> None:
        """After SGLang took a start request: the stages it chose, for the windows to come."""
        from sglang.srt.managers.io_struct import ProfileReqType

        if req.req_type == ProfileReqType.START_PROFILE and getattr(answer, "success", False):
            if req.profile_by_stage:
                state.stages = list(req.profile_stages) if req.profile_stages else None

    def start(self, state: SchedulerProfiler, stage: Any, sglang_start: Callable[[], Any]) -> Any:
        """SGLang's ``_start_profile(stage)``, with a stepscope window in torch.profiler's
        place (or SGLang's own start, for what stepscope does not record)."""
        m = state.manager
        activities = list(m.profiler_activities or DEFAULT_ACTIVITIES)
        why = cannot_serve(activities)
        if why is not None:
            return state.sglang_start(why, sglang_start)
        name = stage_of(stage) if stage is not None else None
        if name is not None and state.stages is not None and name not in state.stages:
            logger.info("stepscope: no %s window: profile_stages is %s", name, state.stages)
            return reply(True, "Succeeded")
        profile = profile_name(m.profile_prefix, m.profile_id)
        suffix = legacy_stage_suffix(name) if name else ""
        window = state.window
        if window is not None:
            # SGLang starts again while a window runs in two cases: a request whose
            # _init_profile refused (refused here too), and a batch of a stage whose window
            # begins while another stage's runs (by stage: a prefill batch in a decode window
            # begun first). SGLang's own replaces the running torch.profiler there without
            # writing it; stepscope writes it, then begins the new window, unless it would
            # carry the same file name (it then goes on).
            if not state.in_predicate:
                return reply(False, "Profiling is already in progress. Call /stop_profile first.")
            if window.trace == trace_stem(profile) + suffix:
                return reply(True, "Succeeded")
            logger.info(
                "stepscope: %s begins while %s runs, which is written as it stands",
                trace_stem(profile) + suffix,
                window.trace,
            )
            state.stop_window()
        state.begin(
            profile=profile,
            profile_id=str(m.profile_id),
            trace=trace_stem(profile) + suffix,
            output_dir=Path(m.torch_profiler_output_dir),
            activities=activities,
            with_stack=m.torch_profiler_with_stack,
            record_shapes=m.torch_profiler_record_shapes,
            merge=bool(m.merge_profiles),
        )
        m.profile_in_progress = True
        state.annotate(bool(m.detailed_annotations))
        return reply(True, "Succeeded")

    def stop(self, state: SchedulerProfiler) -> Any:
        """SGLang's ``_stop_profile`` for stepscope's window."""
        message = state.stop_window()
        m = state.manager
        m.profile_in_progress = False
        m.profiler_start_forward_ct = None
        return reply(True, message)
