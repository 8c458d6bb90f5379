"""What both engine plugins (:mod:`stepscope.vllm`, :mod:`stepscope.sglang`) share: their on/off
switch, ``STEPSCOPE_CONFIG``'s ``"stepscope"`` keys, one-time log lines, and reading the
signatures of the engine callables they hook. Imports nothing of the engines, nor of the
plugins."""

from __future__ import annotations

import inspect
import json
import logging
import os
from typing import Any, Callable

#: stepscope's own keys for a plugin's profilers: a config whose ``"stepscope"`` object is used
#: (JSON text or a path).
CONFIG_ENV = "STEPSCOPE_CONFIG"

#: Parameter kinds, as the plugins' tables of known signatures spell them.
POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY


def switched_on(env: str) -> bool:
    """False when the environment variable ``env`` is ``0``, ``false``, ``no`` or ``off``."""
    value = os.environ.get(env, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def once(logger: logging.Logger, level: int, seen: set[str], key: str, message: str, *args: Any) -> None:
    """Logs ``message`` at ``level`` the first time ``key`` is seen in ``seen``."""
    if key not in seen:
        seen.add(key)
        logger.log(level, message, *args)


def signature_of(fn: Any) -> tuple[tuple[str, Any], ...] | None:
    """``fn``'s parameters as (name, kind) pairs; None when it has no signature."""
    try:
        params = inspect.signature(inspect.unwrap(fn)).parameters.values()
    except (TypeError, ValueError):
        return None
    return tuple((p.name, p.kind) for p in params)


def stepscope_keys_from_env() -> dict[str, Any]:
    """The ``"stepscope"`` object of ``STEPSCOPE_CONFIG`` (empty when unset).

    Only its form is checked here (readable, JSON, an object holding only ``"stepscope"``);
    the keys' values are validated with the engine's fields when a worker's profiler is made,
    since some depend on them (``repeat`` needs ``max_iterations``). Raises
    :class:`stepscope.ConfigError` (a ``ValueError``) naming what is wrong.
    """
    import stepscope

    spec = os.environ.get(CONFIG_ENV, "").strip()
    if not spec:
        return {}
    if spec.startswith("{"):
        text, origin = spec, CONFIG_ENV
    else:
        try:
            with open(spec, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise stepscope.ConfigError(f"{CONFIG_ENV}: cannot read {spec}: {e}") from e
        origin = spec
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise stepscope.ConfigError(f"{origin}: invalid JSON: {e}") from e
    if not isinstance(value, dict):
        raise stepscope.ConfigError(f"{origin}: expected a JSON object")
    others = sorted(k for k in value if k != "stepscope")
    if others:
        raise stepscope.ConfigError(
            f"{origin}: {', '.join(others)}: vLLM's keys come from --profiler-config; "
            f"{CONFIG_ENV} holds only the \"stepscope\" object"
        )
    keys = value.get("stepscope", {})
    if not isinstance(keys, dict):
        raise stepscope.ConfigError(f"{origin}: \"stepscope\" must be a JSON object")
    return keys


def key_on(name: str, keys: Callable[[], dict[str, Any]] = stepscope_keys_from_env) -> bool:
    """``"stepscope": {name: ...}`` is set (and not false) in ``keys()`` (by default
    ``STEPSCOPE_CONFIG``'s); false too when that is bad (reported where a profiler is made)."""
    try:
        value = keys().get(name)
    except ValueError:
        return False
    return value not in (None, False)


def make_request_log(
    log: logging.Logger, keys: Callable[[], dict[str, Any]] = stepscope_keys_from_env
) -> Any:
    """A :class:`stepscope.RequestLog` for the ``"requests"`` key of ``keys()`` (None when it
    is off), its size logged; None, with an error logged, when it cannot be made (a bad
    config included). Never raises: the engine goes on without a log."""
    try:
        import stepscope

        requests = keys().get("requests")
        made = stepscope.RequestLog.from_config({"stepscope": {"requests": requests}})
    except Exception as e:  # noqa: BLE001 - never into the engine
        log.error("stepscope: the request log is off: %s", e)
        return None
    if made is not None:
        count, steps = made.capacity
        log.info(
            "stepscope: request log on (pid %d): the last %d requests and %d steps, %.1f MB",
            os.getpid(), count, steps, made.memory_bytes / 1e6,
        )  # fmt: skip
    return made


