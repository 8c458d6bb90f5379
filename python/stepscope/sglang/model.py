"""The served model's shape, recorded once in each window's profilers from SGLang's own model
config (the batch's ``ModelConfig``: its Hugging Face text config, read by stepscope's core
through ``WorkerProfiler.set_model``, and its dtype) and the tensor-parallel size of this
scheduler's group. ``stepscope analyze`` computes each step's floor from it."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("stepscope.sglang")


def shape_inputs(batch: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The model's Hugging Face config (as a dict) and the keywords of
    ``WorkerProfiler.set_model``, from a forward batch's ``model_config``; None without one."""
    model_config = getattr(batch, "model_config", None)
    if model_config is None:
        return None
    hf = getattr(model_config, "hf_text_config", None) or model_config.hf_config
    config = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    architectures = getattr(model_config.hf_config, "architectures", None)
    if architectures:
        config["architectures"] = list(architectures)
    extra: dict[str, Any] = {}
    dtype = getattr(model_config, "dtype", None)
    if dtype is not None:
        extra["weight_dtype"] = str(dtype).removeprefix("torch.")
        extra["kv_cache_dtype"] = extra["weight_dtype"]
    try:
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size

        extra["tensor_parallel"] = int(get_tensor_model_parallel_world_size())
    except Exception:  # noqa: BLE001 - no parallel state (a test, a tool): unknown
        pass
    return config, extra


def record_model(batch: Any, profilers: list[Any]) -> None:
    """Records the batch's model shape in each profiler not yet given one (never raises)."""
    todo = [p for p in profilers if not getattr(p, "_stepscope_model_recorded", False)]
    if not todo:
        return
    for p in todo:
        try:
            p._stepscope_model_recorded = True
        except AttributeError:
            pass
    try:
        inputs = shape_inputs(batch)
        if inputs is None:
            return
        config, extra = inputs
        for p in todo:
            p.set_model(config, **extra)
    except Exception as e:  # noqa: BLE001 - a profiler never fails its scheduler
        logger.warning("stepscope: the model's shape is not recorded: %s", e)
