"""One ``SchedulerOutput`` as stepscope's :class:`stepscope.Iteration`: vLLM's own counts
(``compute_iteration_details``) and, while a capture is armed, each request's tokens, phase and
computed tokens, from which the core sums the step's work (vLLM's detailed annotation sums,
``IterationDetail::of_shares``: one owner of that rule, not re-derived here)."""

from __future__ import annotations

from typing import Any, NamedTuple


def request_ids_of(scheduler_output: Any) -> list[str]:
    """The ids of the requests one ``SchedulerOutput`` schedules, in its order: the keys of
    ``num_scheduled_tokens`` (new and cached requests alike)."""
    return [str(r) for r in scheduler_output.num_scheduled_tokens]


class Requests(NamedTuple):
    """The requests one ``SchedulerOutput`` schedules, in its order: their ids, the tokens
    scheduled for each, whether each is in its context phase (prefill) as vLLM's
    ``compute_iteration_details`` counts it (a new request, or a cached one still in it), and
    the tokens each had computed before the step (vLLM's ``num_computed_tokens``)."""

    ids: list[str]
    tokens: list[int]
    prefill: list[bool]
    computed: list[int]


def requests_of(scheduler_output: Any, details: Any = None) -> Requests:
    """The :class:`Requests` of one ``SchedulerOutput``. With its ``compute_iteration_details``
    (``details``), a step all in one phase (steady decode) takes no per-request phase test."""
    scheduled = scheduler_output.num_scheduled_tokens
    cached = scheduler_output.scheduled_cached_reqs
    n = len(scheduled)
    if details is not None and details.num_ctx_requests == 0:
        prefill = [False] * n
    elif details is not None and details.num_generation_requests == 0:
        prefill = [True] * n
    else:
        # vLLM's is_context_phase without a call each: a cached request with no output yet
        # is in context, as is every new request (absent from the cached ones).
        produced = dict(zip(cached.req_ids, cached.num_output_tokens, strict=False))
        prefill = [produced.get(r, 0) == 0 for r in scheduled]
    computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
    return Requests(
        ids=[str(r) for r in scheduled],
        tokens=list(scheduled.values()),
        prefill=prefill,
        computed=[int(computed.get(r, 0)) for r in scheduled],
    )


def iteration_of(
    scheduler_output: Any,
    compute_iteration_details: Any,
    shares: bool = False,
    ids: bool = False,
) -> Any:
    """The :class:`stepscope.Iteration` of one ``SchedulerOutput``: vLLM's own
    ``compute_iteration_details`` counts (context = a new request or one still in its context
    phase); with ``shares`` each request's tokens, phase and computed tokens (the core sums
    the step's work from them), with ``ids`` their ids too (:func:`requests_of`)."""
    import stepscope

    d = compute_iteration_details(scheduler_output)
    counts = (
        d.num_ctx_requests,
        d.num_ctx_tokens,
        d.num_generation_requests,
        d.num_generation_tokens,
    )
    if not (shares or ids):
        return stepscope.Iteration(*counts)
    r = requests_of(scheduler_output, d)
    return stepscope.Iteration(
        *counts,
        request_ids=r.ids if ids else None,
        request_tokens=r.tokens,
        request_prefill=r.prefill,
        request_computed=r.computed,
    )
