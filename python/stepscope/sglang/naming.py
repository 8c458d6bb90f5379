"""SGLang's names, ranks and counts: how its traces are named, which rank this scheduler is, and
a forward batch as a :class:`stepscope.Iteration`."""

from __future__ import annotations

from typing import Any

#: What SGLang records when a request names no activities.
DEFAULT_ACTIVITIES = ("CPU", "GPU")
#: SGLang's stages, in the order SGLang names them.
STAGES = ("prefill", "decode")


def activities_of(req: Any) -> list[str]:
    """The activities a request asks for (SGLang's default when it names none)."""
    return list(req.activities or DEFAULT_ACTIVITIES)


def profile_name(prefix: str | None, profile_id: Any) -> str:
    """``[prefix-]{profile_id}``: how every rank's file names of one profile begin."""
    return (f"{prefix}-" if prefix else "") + str(profile_id)


def trace_stem(profile: str) -> str:
    """SGLang's trace file stem for this rank: ``{profile}-TP-{n}`` plus ``-DP-``, ``-PP-`` and
    ``-EP-`` parts where that parallelism is on."""
    return "-".join([profile, *rank_parts()])


def rank_parts() -> list[str]:
    """``TP-{n}`` and the ``DP``/``PP``/``EP`` parts of SGLang's file names for this rank."""
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    parts = [f"TP-{par.tp_rank}"]
    if par.num_dp_ranks > 1:
        parts.append(f"DP-{par.dp_rank}")
    if par.pp_size > 1:
        parts.append(f"PP-{par.pp_rank}")
    if par.moe_ep_size > 1:
        parts.append(f"EP-{par.moe_ep_rank}")
    return parts


def legacy_stage_suffix(stage: str) -> str:
    """The stage's part of the file name as SGLang's default profiler writes it: ``-EXTEND``
    / ``-DECODE`` (V2 writes ``-prefill`` / ``-decode``)."""
    return "-EXTEND" if stage == "prefill" else "-DECODE"


def stage_of(forward_mode: Any) -> str | None:
    """SGLang's profiling stage of a forward mode: ``prefill`` (every extend kind, mixed
    included), ``decode``, or None (idle, prebuilt: no model forward)."""
    if forward_mode.is_prefill():
        return "prefill"
    if forward_mode.is_decode():
        return "decode"
    return None


def iteration_of(
    batch: Any, request_ids: list[str] | None = None, shares: bool = False
) -> Any:
    """The batch's counts as a :class:`stepscope.Iteration`: extend requests and tokens as the
    context part, decoding requests (one token each) as the generation part; a mixed batch has
    both; with the requests' ``rid`` s when given, or with ``shares``, each one's tokens (its
    ``extend_lens`` entry, one in decode), phase, and tokens already computed (its
    ``prefix_lens`` entry in an extend, its ``seq_lens_cpu`` entry less the token it decodes),
    from which the core sums the step's work. None for a batch with no model forward."""
    import stepscope

    mode = batch.forward_mode
    reqs = len(batch.reqs)
    if mode.is_decode():
        seq = getattr(batch, "seq_lens_cpu", None)
        computed = [int(s) - 1 for s in seq.tolist()] if seq is not None else None
        given = _shares(request_ids, [1] * reqs, roles_of(batch), computed, shares)
        return stepscope.Iteration(num_gen_reqs=reqs, num_gen_tokens=reqs, **given)
    if not mode.is_extend():
        return None
    prefill = roles_of(batch)
    decoding = prefill.count(False)
    tokens = int(batch.extend_num_tokens or 0)
    lens = list(getattr(batch, "extend_lens", None) or ())
    prefix = getattr(batch, "prefix_lens", None)
    computed = [int(p) for p in prefix] if prefix is not None else None
    given = _shares(request_ids, lens, prefill, computed, shares)
    return stepscope.Iteration(
        num_ctx_reqs=reqs - decoding,
        num_ctx_tokens=max(tokens - decoding, 0),
        num_gen_reqs=decoding,
        num_gen_tokens=decoding,
        **given,
    )


def roles_of(batch: Any) -> list[bool]:
    """Each request's role in a forward batch as SGLang's batch gives it (``True``: prefill):
    a decode batch decodes every request; an extend batch prefills each, but a mixed batch's
    ``decoding_reqs`` (its last ones, one token each: ``mix_with_running``). SGLang's own
    classification, which its step spans and profiler stages follow: the plugin's one rule
    for the trace header's phases and the request log's roles (the log records it as given)."""
    if batch.forward_mode.is_decode():
        return [False] * len(batch.reqs)
    running = (batch.decoding_reqs or ()) if batch.forward_mode.is_mixed() else ()
    in_decode = {id(r) for r in running}
    return [id(r) not in in_decode for r in batch.reqs]


def _shares(
    request_ids: list[str] | None,
    tokens: list[int],
    prefill: list[bool],
    computed: list[int] | None,
    shares: bool,
) -> dict:
    """``Iteration`` keywords for the requests: their ids when given, and (with ids or
    ``shares``) each one's tokens, phase and computed tokens when there is one of each per
    request (else the ids alone; the computed tokens only when known for every one)."""
    if request_ids is None and not shares:
        return {}
    n = len(request_ids) if request_ids is not None else len(prefill)
    ids = {} if request_ids is None else {"request_ids": request_ids}
    if len(tokens) != n or len(prefill) != n:
        return ids
    given = {**ids, "request_tokens": [int(t) for t in tokens], "request_prefill": prefill}
    if computed is not None and len(computed) == n:
        given["request_computed"] = computed
    return given


def worker_name() -> str:
    """This scheduler's worker name: ``sglang-TP-{n}[-DP-..]...``."""
    try:
        return "sglang-" + "-".join(rank_parts())
    except Exception:  # noqa: BLE001 - no parallel state published (a test, a tool)
        return "sglang"


def local_rank() -> int:
    """This scheduler's GPU on its node (0 where SGLang publishes none)."""
    try:
        from sglang.srt.runtime_context import get_device

        return int(get_device().gpu_id)
    except Exception:  # noqa: BLE001
        return 0


def global_rank() -> int | None:
    """This scheduler's rank in the job: torch.distributed's, else its TP rank."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001
        pass
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_rank)
    except Exception:  # noqa: BLE001
        return None


def world_size() -> int:
    """The job's ranks (1 without torch.distributed)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # noqa: BLE001
        pass
    return 1


def is_merging_rank() -> bool:
    """The rank that merges (SGLang's: TP, DP, PP and EP rank 0)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        return (
            par.tp_rank == 0
            and (par.num_dp_ranks <= 1 or par.dp_rank == 0)
            and (par.pp_size <= 1 or par.pp_rank == 0)
            and (par.moe_ep_size <= 1 or par.moe_ep_rank == 0)
        )
    except Exception:  # noqa: BLE001
        return True


def first_rank_in_node() -> bool:
    """Whether this scheduler's GPU is the first of its node (SGLang's test for
    ``cudaProfilerStart``); True where SGLang's device config is not published."""
    try:
        from sglang.srt.runtime_context import get_device

        dev = get_device()
        return dev.gpu_id == dev.base_gpu_id
    except Exception:  # noqa: BLE001 - no device config (a tool, a test)
        return True
