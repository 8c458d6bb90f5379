"""Request lifecycles in an SGLang scheduler (``"stepscope": {"requests": true}`` in
``STEPSCOPE_CONFIG``): each scheduler process records, in a :class:`stepscope.RequestLog` (the
one vLLM's plugin fills), each request's arrival in its queue, every forward batch that carries
it (an extend chunk of N tokens, or a decode step), its retractions, its output tokens and its
end, from the scheduler's own calls:

- ``Scheduler._add_request_to_queue``: the request reached the scheduler's queue, with its
  prompt length (SGLang stamps ``wait_queue_entry_time`` there). With ``is_retracted``: a
  running request SGLang retracted to free KV cache, recorded as a preemption in the next
  batch (SGLang retracts while it builds that batch). Without disaggregation, a request the
  call refuses (a queue limit, a priority SGLang does not take) ends there, ``abort``.
- ``Scheduler.run_batch``: a forward batch begins: its requests, each one's tokens
  (``extend_lens``; one per decoding request, a mixed batch's ``decoding_reqs`` included) and
  the tokens it had computed before (``prefix_lens``; in decode its length less one, at least
  its prompt), and the waiting queue's length. Batches without a model forward (idle, prebuilt) are no step.
- ``Scheduler.process_batch_result``: the batch's results are in: each request's new output
  tokens (what its ``output_ids`` grew by) and its finish reason where it finished.

SGLang's overlap loop processes batch N after it launched batch N+1, with a copy of batch N:
each begun step waits in a queue of the scheduler's, matched at its result by the batch's first
request. ``/server_info`` carries each scheduler's log of its last steps; a capture's window
writes its log beside its traces.

What the plugin does not see: a request aborted while it waits (SGLang drops it from the queue
with no call the plugin hooks) has no end in the log; the arrival is the scheduler's (SGLang's
API server stamps its own on another process's clock); the disaggregation queues of prefill and
decode servers are not told apart (a request's arrival is where it reached the scheduler); a
speculative batch's verify is recorded as a decode step of one token. Hooks never raise into
the scheduler: a failure is logged once and the log goes on.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any, Callable

from stepscope import _plugin
from stepscope._plugin import POS, signature_of
from stepscope.sglang.otel import finished as otel_finished
from stepscope.sglang.otel import settings as otel_settings
from stepscope.sglang.interface import warn_once
from stepscope.sglang.naming import roles_of

logger = logging.getLogger("stepscope.sglang")

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
SCHEDULER = SCHEDULER_MODULE + ".Scheduler"
#: The scheduler's methods the log hooks, with their parameters as SGLang 0.5.23 declares them.
HOOKED = {
    "_add_request_to_queue": (("self", POS), ("req", POS), ("is_retracted", POS)),
    "run_batch": (("self", POS), ("batch", POS), ("pp_proxy_tensors", POS)),
    "process_batch_result": (("self", POS), ("batch", POS), ("result", POS)),
}
#: How many of the log's last steps ``/server_info`` carries per scheduler.
SERVER_INFO_STEPS = 512
#: Begun steps whose results are not in yet, at most (the overlap loop has one).
IN_FLIGHT = 64

_log: Any = None
_tried = False


def requests_wanted() -> bool:
    """``"stepscope": {"requests": ...}`` is set (and not false) in ``STEPSCOPE_CONFIG``."""
    return _plugin.key_on("requests")


def request_log() -> Any:
    """This process's log, made at the first call; None when off or when making it failed
    (logged once)."""
    global _log, _tried
    if not _tried:
        _tried = True
        _log = _plugin.make_request_log(logger)
    return _log


def scheduler_known() -> bool:
    """Whether SGLang's ``Scheduler`` has the methods the log hooks, as the plugin knows them;
    else one warning, and no log."""
    try:
        import importlib

        cls = importlib.import_module(SCHEDULER_MODULE).Scheduler
    except Exception:  # noqa: BLE001 - no scheduler here
        return False
    differ = [n for n, known in HOOKED.items() if signature_of(getattr(cls, n, None)) != known]
    if differ:
        warn_once("requests-interface", "stepscope: no request log: this SGLang's Scheduler."
                  "%s is not what stepscope knows", ", Scheduler.".join(differ))  # fmt: skip
        return False
    return True


class _InFlight:
    """One scheduler's begun steps whose results are not in, and the requests it retracted
    for the batch it builds next."""

    def __init__(self) -> None:
        self.steps: deque[tuple[int, int]] = deque(maxlen=IN_FLIGHT)
        self.retracted: list[str] = []

    def take(self, first_req: Any) -> int | None:
        """The step of the batch whose first request is ``first_req`` (or of its copy): the
        oldest begun one with that first request; those begun before it are dropped (their
        results never came)."""
        first = id(first_req)
        while self.steps:
            step, key = self.steps.popleft()
            if key == first:
                return step
        return None


_in_flight: dict[int, _InFlight] = {}


def _of(scheduler: Any) -> _InFlight:
    state = _in_flight.get(id(scheduler))
    if state is None:
        state = _in_flight[id(scheduler)] = _InFlight()
    return state


def _guarded(what: str, record: Callable[..., Any], *args: Any) -> Any:
    """Runs one recording call; a failure is logged once, never raised into the scheduler."""
    try:
        return record(*args)
    except Exception as e:  # noqa: BLE001 - the scheduler goes on
        warn_once(f"requests:{what}", "stepscope: the request log failed in %s: %r", what, e)
        return None


def _record_arrival(log: Any, scheduler: Any, req: Any, retracted: bool) -> None:
    rid = str(req.rid)
    if retracted:
        _of(scheduler).retracted.append(rid)
        return
    log.arrived(rid, len(req.origin_input_ids))
    # Without disaggregation a queued request is the waiting queue's last; one that is not
    # was refused at the door (a queue limit, a priority SGLang does not take).
    queue = getattr(scheduler, "waiting_queue", None)
    mode = getattr(getattr(scheduler, "disaggregation_mode", None), "name", None)
    if mode == "NULL" and queue is not None and (not queue or queue[-1] is not req):
        log.finished(None, rid, "abort")


def _is_step(batch: Any) -> bool:
    """A batch with a model forward and requests (idle and prebuilt batches are no step)."""
    mode = batch.forward_mode
    return bool(batch.reqs) and (mode.is_extend() or mode.is_decode())


def _record_begin(log: Any, scheduler: Any, batch: Any) -> int | None:
    if not _is_step(batch):
        return None
    mode = batch.forward_mode
    reqs = batch.reqs
    ids = [str(r.rid) for r in reqs]
    if mode.is_extend():
        tokens = [int(n) for n in batch.extend_lens]
        computed = [int(n) for n in batch.prefix_lens]
    else:
        tokens = [1] * len(reqs)
        # All but the token it feeds; at least its prompt (in the overlap loop the token the
        # last batch made is not in its output_ids until that batch's result is processed).
        computed = [max(r.seqlen - 1, len(r.origin_input_ids)) for r in reqs]
    prefill = roles_of(batch)
    waiting = getattr(scheduler, "waiting_queue", None)
    step = log.begin_step(len(waiting) if waiting is not None else 0)
    # The batch's roles, not the log's inference: in the overlap loop a request's first
    # decode begins before the result of its last prefill chunk is in.
    log.scheduled(step, ids, tokens, computed, prefill)
    state = _of(scheduler)
    if state.retracted:
        log.preempted(step, state.retracted)
        state.retracted = []
    state.steps.append((step, id(reqs[0])))
    return step


def _record_result(log: Any, scheduler: Any, before: list[tuple[Any, int, bool]]) -> None:
    step = _of(scheduler).take(before[0][0])
    if step is None:
        return
    log.end_step(step)
    ids, grown, done = [], [], []
    for req, outputs, was_finished in before:
        rid = str(req.rid)
        new = len(req.output_ids) - outputs
        if new > 0:
            ids.append(rid)
            grown.append(new)
        if req.finished() and not was_finished:
            # The engine's name as it is: the log reads it (its one finish-reason table).
            log.finished(step, rid, type(req.finished_reason).__name__)
            done.append(req)
    if ids:
        log.produced(step, ids, grown)
    if done and otel_settings() is not None:
        for req in done:
            _guarded("otel", otel_finished, log, scheduler, req)


def around_add_request(
    original: Callable[..., Any], scheduler: Any, req: Any, is_retracted: bool = False
) -> Any:
    """``Scheduler._add_request_to_queue``."""
    result = original(scheduler, req, is_retracted)
    if (log := request_log()) is not None:
        _guarded("_add_request_to_queue", _record_arrival, log, scheduler, req, is_retracted)
    return result


def around_run_batch(original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any,
                     **kwargs: Any) -> Any:  # fmt: skip
    """``Scheduler.run_batch``: a step begins with the batch."""
    if (log := request_log()) is not None:
        _guarded("run_batch", _record_begin, log, scheduler, batch)
    return original(scheduler, batch, *args, **kwargs)


def around_process_result(original: Callable[..., Any], scheduler: Any, batch: Any,
                          *args: Any, **kwargs: Any) -> Any:  # fmt: skip
    """``Scheduler.process_batch_result``: the step of the batch ends."""
    log = request_log()
    before = None
    if log is not None and _guarded("process_batch_result", _is_step, batch):
        # Each request with what it had: the batch's list may be rebound meanwhile.
        before = _guarded("process_batch_result", lambda: [
            (r, len(r.output_ids), r.finished()) for r in batch.reqs])  # fmt: skip
    result = original(scheduler, batch, *args, **kwargs)
    if before is not None:
        _guarded("process_batch_result", _record_result, log, scheduler, before)
    return result


def hooks() -> list[tuple[str, Callable[..., Any]]]:
    """The scheduler's methods the log hooks (``AROUND``), and the hook of each."""
    return [
        (f"{SCHEDULER}._add_request_to_queue", around_add_request),
        (f"{SCHEDULER}.run_batch", around_run_batch),
        (f"{SCHEDULER}.process_batch_result", around_process_result),
    ]


def server_info_log() -> Any:
    """What ``/server_info`` carries of this scheduler's log: its document of the last
    :data:`SERVER_INFO_STEPS` steps, or None when the log is off."""
    log = request_log()
    if log is None:
        return None
    return _guarded(
        "server_info", lambda: log.document(max(0, log.step_index - SERVER_INFO_STEPS))
    )


def window_start() -> int | None:
    """The log's step at a window's start (None when the log is off)."""
    log = request_log()
    return None if log is None else int(log.step_index)


def write_window(output_dir: Path, stem: str, since: int | None) -> None:
    """Writes the log's steps after ``since`` beside a window's traces, as
    ``{stem}.requests.json`` (whole or not at all), for ``stepscope analyze --requests``."""
    log = request_log()
    if log is None or since is None:
        return
    from stepscope._native import request_log_name

    path = Path(output_dir) / request_log_name(stem)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        log.write_json(str(path), since)
    except Exception as e:  # noqa: BLE001 - the window's traces stand without it
        logger.error("stepscope: the window's request log was not written: %s", e)
        return
    logger.info("stepscope: request log of the window (steps after %d): %s", since, path)
