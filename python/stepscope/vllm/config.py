"""vLLM's ``ProfilerConfig`` as stepscope's config, and the profiler made from it: vLLM's fields
with ``STEPSCOPE_CONFIG``'s keys, validated together; a field of a newer vLLM handled as the
plugin promises."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from stepscope.vllm.environment import CONFIG_ENV, info_once, logger, stepscope_keys, warn_once
from stepscope.vllm.interfaces import vllm_version

def config_dict(profiler_config: Any) -> dict[str, Any]:
    """vLLM's ``ProfilerConfig`` as stepscope's config: every vLLM field, plus the
    ``"stepscope"`` keys of ``STEPSCOPE_CONFIG``."""
    fields = {f.name: getattr(profiler_config, f.name) for f in dataclasses.fields(profiler_config)}
    keys = stepscope_keys()
    if keys:
        fields["stepscope"] = dict(keys)
    return fields


def build_profiler(profiler_config: Any, *, worker_name: str, local_rank: int) -> Any:
    """stepscope's profiler for vLLM's config and ``STEPSCOPE_CONFIG``'s keys, validated
    together (see :func:`make_with_known_fields`)."""
    import stepscope

    def make(config: dict[str, Any]) -> Any:
        return stepscope.WorkerProfiler(
            config, worker_name=worker_name, local_rank=local_rank, rank=rank_of(worker_name)
        )

    profiler = make_with_known_fields(profiler_config, config_dict(profiler_config), make)
    add_version_metadata(profiler)
    return profiler


def make_with_known_fields(
    profiler_config: Any, config: dict[str, Any], make: Callable[[dict[str, Any]], Any]
) -> Any:
    """``make(config)``, where ``config`` is vLLM's ``profiler_config`` as stepscope's config. A
    bad ``stepscope.*`` key is logged as an error naming it and left out (the rest still
    apply). A ``ProfilerConfig`` field stepscope does not know (a newer vLLM's) is left out with
    one info line when it holds its default, else raises :class:`stepscope.ConfigError` after
    one warning naming the field and its value (vLLM's own profiler then serves the process),
    as does any other vLLM field stepscope does not accept."""
    import stepscope

    keys = config.get("stepscope", {})
    defaults = field_defaults(profiler_config)
    while True:
        try:
            return make(config)
        except stepscope.ConfigError as e:
            field = getattr(e, "field", None) or ""
            key = field.split(".")[1] if field.startswith("stepscope.") else None
            if key is not None and key in keys:
                logger.error("stepscope: %s; %s left out (from %s)", e, field, CONFIG_ENV)
                del keys[key]
                continue
            if not getattr(e, "unknown_key", False) or field not in defaults:
                raise
            value = config[field]
            if not _is_default(value, defaults[field]):
                warn_once(
                    f"field:{field}",
                    "stepscope: vLLM's ProfilerConfig field %s is %r, which this stepscope "
                    "does not know (vLLM %s); vLLM's own profiler serves this process",
                    field,
                    value,
                    vllm_version(),
                )
                raise
            info_once(
                f"field:{field}",
                "stepscope: vLLM's ProfilerConfig field %s (vLLM %s) is not one this stepscope "
                "knows; at its default (%r), left out",
                field,
                vllm_version(),
                value,
            )
            del config[field]


def field_defaults(profiler_config: Any) -> dict[str, Any]:
    """Each field's default in vLLM's config dataclass (pydantic's or the standard one);
    fields without one are left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(profiler_config):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            try:
                out[f.name] = f.default_factory()
            except Exception:  # noqa: BLE001 - no default to compare with
                continue
    return out


def _is_default(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - an odd type: treat as set
        return False


def add_version_metadata(profiler: Any) -> None:
    """vLLM's version in the trace header, as vLLM's own torch profiler stamps it
    (``vllm_version``, ``vllm_version_tuple``)."""
    try:
        import vllm.version

        profiler.set_trace_metadata("vllm_version", vllm.version.__version__)
        profiler.set_trace_metadata(
            "vllm_version_tuple", [str(p) for p in vllm.version.__version_tuple__]
        )
    except Exception:  # noqa: BLE001 - metadata is optional
        logger.debug("stepscope: no vLLM version for the trace header", exc_info=True)


_torch_unavailable: list[str | None] = []


def torch_unavailable() -> str | None:
    """Why stepscope's torch backend cannot run in this process (see
    :func:`stepscope.torch_backend_error`), asked once per process."""
    if not _torch_unavailable:
        import stepscope

        _torch_unavailable.append(stepscope.torch_backend_error())
    return _torch_unavailable[0]


def rank_of(worker_name: str) -> int | None:
    """The global rank in vLLM's worker name (``…_rank{N}``, from ``get_worker_rank_suffix``);
    ``None`` when absent (then the ``RANK`` environment variable is used)."""
    match = re.search(r"rank(\d+)$", worker_name)
    return int(match.group(1)) if match else None
