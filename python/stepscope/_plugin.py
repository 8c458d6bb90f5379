"""What both engine plugins (:mod:`stepscope.vllm`, :mod:`stepscope.sglang`) share: their on/off
switch, ``STEPSCOPE_CONFIG``'s ``"stepscope"`` keys, one-time log lines, and reading the
signatures of the engine callables they hook. Imports nothing of the engines, nor of the
plugins."""

from __future__ import annotations

import inspect
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
    """The ``"stepscope"`` object of ``STEPSCOPE_CONFIG`` (empty when unset), read and its
    form checked by the library (``ProfilerConfig::stepscope_keys_from_env``, the one reader
    of the variable); the keys' values are validated with the engine's fields when a worker's
    profiler is made. Raises :class:`stepscope.ConfigError` (a ``ValueError``) naming what is
    wrong."""
    from stepscope._native import stepscope_keys_from_env as read

    return read()


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


