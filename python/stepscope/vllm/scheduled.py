"""One ``SchedulerOutput`` as stepscope's :class:`stepscope.Iteration`: vLLM's own counts
(``compute_iteration_details``) and, while a capture is armed, each request's tokens, output
and computed tokens: the core decides each one's phase from its output (``in_prefill``) and
sums the step's work (``IterationDetail::of_shares``); neither rule is re-derived here."""

from __future__ import annotations

from typing import Any, NamedTuple


def request_ids_of(scheduler_output: Any) -> list[str]:
    """The ids of the requests one ``SchedulerOutput`` schedules, in its order: the keys of
    ``num_scheduled_tokens`` (new and cached requests alike)."""
    return [str(r) for r in scheduler_output.num_scheduled_tokens]


class Requests(NamedTuple):
    """The requests one ``SchedulerOutput`` schedules, in its order: their ids, the tokens
    scheduled for each, the tokens each had produced before the step (vLLM's
    ``num_output_tokens``, 0 for a new request: what vLLM's ``is_context_phase`` reads, and
    from which stepscope's core decides each one's phase), and the tokens each had computed
    before (vLLM's ``num_computed_tokens``)."""

    ids: list[str]
    tokens: list[int]
    outputs: list[int]
    computed: list[int]


def requests_of(scheduler_output: Any) -> Requests:
    """The :class:`Requests` of one ``SchedulerOutput``."""
    scheduled = scheduler_output.num_scheduled_tokens
    cached = scheduler_output.scheduled_cached_reqs
    produced = dict(zip(cached.req_ids, cached.num_output_tokens, strict=False))
    computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
    return Requests(
        ids=[str(r) for r in scheduled],
        tokens=list(scheduled.values()),
        outputs=[int(produced.get(r, 0)) for r in scheduled],
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
    phase); with ``shares`` each request's tokens, output and computed tokens (the core decides
    each one's phase and sums the step's work from them), with ``ids`` their ids too
    (:func:`requests_of`)."""
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
    r = requests_of(scheduler_output)
    return stepscope.Iteration(
        *counts,
        request_ids=r.ids if ids else None,
        request_tokens=r.tokens,
        request_outputs=r.outputs,
        request_computed=r.computed,
    )
