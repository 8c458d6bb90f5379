"""Request lifecycles (``"stepscope": {"requests": true}`` in ``STEPSCOPE_CONFIG``): the engine
core's scheduler records, in a :class:`stepscope.RequestLog`, each request's arrival in its
queue, every step that schedules it (prefill chunk or decode), its preemptions, its tokens and
its end, with each step's begin and end, where vLLM stamps its own request metrics:

- ``Scheduler.add_request``: the request reached the queue (vLLM's ``QUEUED`` event), with its
  prompt length and ``arrival_time`` (the API server's clock);
- ``Scheduler.schedule``: a step begins (vLLM's ``SCHEDULED`` timestamp is taken as it
  starts); the output's new and cached requests, their scheduled and computed tokens, and
  ``preempted_req_ids``;
- ``Scheduler.update_from_output``: the step ends (vLLM's ``EngineCoreOutputs.timestamp``, its
  first and last token times, is taken there); each request's new tokens and finish reason;
- ``Scheduler.finish_requests``: aborts between steps.

``EngineCore.stepscope_requests(since)`` answers the API server's utility call with the log as
JSON; the API server's ``GET /stepscope/requests?since=N`` route asks every engine core.
``EngineCore.stepscope_request_spans`` answers the request-span exporter's (``"otel"``,
``stepscope.vllm.otel``) with a future its own thread completes.

A capture's window: ``EngineCore.profile`` notes the log's step at a start, and at the stop,
once its workers' stop has returned, writes the log's document from that step on beside the
traces (``torch_profiler_dir``), as ``engine{N}.{stop ns}.requests.json``: each request's
arrival, queue wait and steps, which a trace does not hold, for ``stepscope analyze
--requests`` to join to the trace's iterations by request id.

Each step is named by the ``SchedulerOutput`` it scheduled, so an engine that schedules step
N+1 before step N's output is processed (async scheduling, pipeline parallelism) records both
correctly. Hooks never raise into the engine: a failure is logged once and the log goes on.
"""

from __future__ import annotations

import functools
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import Any, Callable

from stepscope._plugin import make_request_log
from stepscope.vllm.environment import key_on, logger, stepscope_keys, warn_once
from stepscope.vllm.interfaces import PATCHED_MARK, warn_unpatched

#: The attribute a ``SchedulerOutput`` carries: the log's index of the step it scheduled.
STEP_ATTR = "_stepscope_step"

_log: Any = None
_tried = False


def requests_wanted() -> bool:
    """``"stepscope": {"requests": ...}`` is set (and not false) in ``STEPSCOPE_CONFIG``."""
    return key_on("requests")


def request_log() -> Any:
    """This process's log, made at the first call; ``None`` when off or when making it failed
    (logged once)."""
    global _log, _tried
    if not _tried:
        _tried = True
        _log = make_request_log(logger, stepscope_keys)
    return _log


def _guarded(what: str, record: Callable[..., None], *args: Any) -> None:
    """Runs one recording call; a failure is logged once, never raised into the engine."""
    try:
        record(*args)
    except Exception as e:  # noqa: BLE001 - the engine goes on
        warn_once(f"requests:{what}", "stepscope: the request log failed in %s: %r", what, e)


def _finish_name(reason: Any) -> str:
    """vLLM's ``FinishReason`` or ``RequestStatus`` by its name, as the log reads it (the log
    keeps the one finish-reason table)."""
    return str(getattr(reason, "name", reason))


def _record_arrival(log: Any, request: Any) -> None:
    log.arrived(str(request.request_id), int(request.num_prompt_tokens or 0),
                getattr(request, "arrival_time", None))  # fmt: skip


def _record_schedule(log: Any, step: int, out: Any) -> None:
    preempted = getattr(out, "preempted_req_ids", None)
    if not out.total_num_scheduled_tokens and not preempted and log.discard_step(step):
        # A poll that scheduled nothing (vLLM's loop polls a millisecond apart while it
        # waits, e.g. for remote KV transfers): no room in the ring.
        return
    setattr(out, STEP_ATTR, step)
    tokens = out.num_scheduled_tokens
    new = out.scheduled_new_reqs
    # vLLM's own counts of each request's output decide its role in the log (a new request
    # has none; a cached one vLLM's num_output_tokens, what its is_context_phase reads).
    if new:
        ids = [r.req_id for r in new]
        log.scheduled(step, ids, [tokens[i] for i in ids], [r.num_computed_tokens for r in new],
                      outputs=[0] * len(ids))  # fmt: skip
    cached = out.scheduled_cached_reqs
    if cached.req_ids:
        log.scheduled(step, cached.req_ids, [tokens[i] for i in cached.req_ids],
                      cached.num_computed_tokens, outputs=cached.num_output_tokens)  # fmt: skip
    if preempted:
        log.preempted(step, preempted)


def _record_outputs(log: Any, step: int, outputs: Any) -> None:
    log.end_step(step)
    for eco in (outputs or {}).values():
        outs = eco.outputs
        if not outs:
            continue
        log.produced(step, [o.request_id for o in outs], [len(o.new_token_ids) for o in outs])
        for o in outs:
            if o.finish_reason is not None:
                log.finished(step, o.request_id, _finish_name(o.finish_reason))


def _record_finished(log: Any, requests: Any, status: Any) -> None:
    reason = _finish_name(status)
    for r in requests or ():
        log.finished(None, str(r.request_id), reason)


def _patch_scheduler(module: ModuleType) -> None:
    """Wraps the scheduler's four methods (module docs); a vLLM without them keeps its own."""
    scheduler = getattr(module, "Scheduler", None)
    names = ("add_request", "schedule", "update_from_output", "finish_requests")
    missing = [n for n in names if not callable(getattr(scheduler, n, None))]
    if missing:
        warn_unpatched(module, ", ".join(f"Scheduler.{n}" for n in missing))
        return
    if hasattr(scheduler.schedule, PATCHED_MARK):
        return
    add_request = scheduler.add_request
    schedule = scheduler.schedule
    update_from_output = scheduler.update_from_output
    finish_requests = scheduler.finish_requests

    def stepscope_add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = add_request(self, request, *args, **kwargs)
        if (log := request_log()) is not None:
            _guarded("add_request", _record_arrival, log, request)
        return result

    def stepscope_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        log = request_log()
        if log is None:
            return schedule(self, *args, **kwargs)
        try:
            step = log.begin_step(len(self.waiting))
        except Exception:  # noqa: BLE001 - the engine goes on, this step unrecorded
            return schedule(self, *args, **kwargs)
        out = schedule(self, *args, **kwargs)
        _guarded("schedule", _record_schedule, log, step, out)
        return out

    def stepscope_update_from_output(self: Any, scheduler_output: Any, *args: Any,
                                     **kwargs: Any) -> Any:  # fmt: skip
        outputs = update_from_output(self, scheduler_output, *args, **kwargs)
        step = getattr(scheduler_output, STEP_ATTR, None)
        if step is not None and (log := request_log()) is not None:
            _guarded("update_from_output", _record_outputs, log, step, outputs)
        return outputs

    def stepscope_finish_requests(self: Any, request_ids: Any, finished_status: Any,
                                  *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        done = finish_requests(self, request_ids, finished_status, *args, **kwargs)
        if (log := request_log()) is not None:
            _guarded("finish_requests", _record_finished, log, done, finished_status)
        return done

    for name, original, wrapper in (
        ("add_request", add_request, stepscope_add_request),
        ("schedule", schedule, stepscope_schedule),
        ("update_from_output", update_from_output, stepscope_update_from_output),
        ("finish_requests", finish_requests, stepscope_finish_requests),
    ):
        wrapper.__doc__ = original.__doc__
        wrapper.__name__ = name
        wrapper.__qualname__ = getattr(original, "__qualname__", name)
        setattr(wrapper, PATCHED_MARK, original)
        setattr(scheduler, name, wrapper)
    logger.debug("stepscope: %s.Scheduler records request lifecycles", module.__name__)


def engine_requests(self: Any, since: int = 0) -> str:
    """``EngineCore.stepscope_requests``, for the API server's utility call: this engine
    core's request log above step ``since`` as JSON text (``{"requests": null}`` when off)."""
    log = request_log() if requests_wanted() else None
    if log is None:
        return json.dumps({"pid": os.getpid(), "requests": None, "steps": None})
    return str(log.document_json(max(0, int(since))))


class _SpanThread:
    """The engine core's request-span builder (``"otel"``): one thread of its own, and the
    library's builder of its log's spans."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="stepscope-spans")
        from stepscope.otel import SpanBuilder

        self.spans = SpanBuilder()

    def build(self, log: Any, wanted: list[Any], salt: int, costliest: int, steps: bool) -> Any:
        message, requests, spans, lost = self.spans.build(log, wanted, salt, costliest, steps)
        return {"otlp": message, "requests": requests, "spans": spans, "steps_lost": lost}


_span_thread: _SpanThread | None = None


def engine_request_spans(
    self: Any, wanted: list[Any], salt: int, costliest: int, steps: bool
) -> Any:
    """``EngineCore.stepscope_request_spans``, for the API server's utility call: a future of
    the spans of the finished requests among ``wanted`` this engine core's log holds
    (``{"otlp", "requests", "spans", "steps_lost"}``), built on a thread of its own; with
    ``steps``, the spans of the steps ended since the last call's go with them. ``{"otlp":
    None}`` at once when the log is off."""
    global _span_thread
    log = request_log() if requests_wanted() else None
    if log is None:
        return {"otlp": None, "requests": 0, "spans": 0, "steps_lost": 0}
    if _span_thread is None:
        _span_thread = _SpanThread()
    t = _span_thread
    future: Future[Any] = t.pool.submit(t.build, log, wanted, salt, costliest, steps)
    return future


#: The attribute an engine core carries while a capture runs: the log's step at its start.
WINDOW_ATTR = "_stepscope_requests_since"


def window_file(engine: int, stop_ns: int) -> str:
    """The name of one engine core's request log of a capture window (the format's rule:
    ``engine{N}.{stop ns}.requests.json``)."""
    from stepscope._native import engine_log_stem, request_log_name

    return request_log_name(engine_log_stem(engine, stop_ns))


def _write_window(core: Any, log: Any, since: int) -> None:
    """Writes the log's document above step ``since`` into the capture's trace directory,
    whole or not at all (``RequestLog.write_json``: the traces' own temporaries, fsynced and
    renamed into place)."""
    config = getattr(getattr(core, "vllm_config", None), "profiler_config", None)
    directory = getattr(config, "torch_profiler_dir", None)
    if getattr(config, "profiler", None) != "torch" or not directory:
        return
    name = window_file(int(getattr(core, "engine_index", 0) or 0), time.time_ns())
    path = os.path.join(directory, name)
    os.makedirs(directory, exist_ok=True)
    log.write_json(path, since)
    logger.info("stepscope: request log of the capture (steps after %d): %s", since, path)


def _patch_profile(core: Any) -> None:
    """``EngineCore.profile``: a start notes the log's step; a stop, once the workers' stop has
    returned, writes the window's log beside the traces. Never raises into the engine."""
    profile = getattr(core, "profile", None)
    if not callable(profile) or hasattr(profile, PATCHED_MARK):
        return

    # vLLM's utility calls read the method's signature (its parameters' types): the
    # wrapper shows the original's.
    @functools.wraps(profile)
    def stepscope_profile(self: Any, is_start: bool = True, *args: Any, **kwargs: Any) -> Any:
        log = request_log()
        result = profile(self, is_start, *args, **kwargs)
        if log is None:
            return result
        if is_start:
            setattr(self, WINDOW_ATTR, log.step_index)
        else:
            since = getattr(self, WINDOW_ATTR, None)
            setattr(self, WINDOW_ATTR, None)
            if since is not None:
                _guarded("profile", _write_window, self, log, since)
        return result

    setattr(stepscope_profile, PATCHED_MARK, profile)
    core.profile = stepscope_profile


def _patch_engine_core(module: ModuleType) -> None:
    core = getattr(module, "EngineCore", None)
    if core is None:
        warn_unpatched(module, "EngineCore")
        return
    if not hasattr(core, "stepscope_requests"):
        core.stepscope_requests = engine_requests
    if not hasattr(core, "stepscope_request_spans"):
        core.stepscope_request_spans = engine_request_spans
    if requests_wanted():
        _patch_profile(core)
