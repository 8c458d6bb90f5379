"""The vLLM plugin's settings and voice: its switch (``STEPSCOPE_VLLM``), ``STEPSCOPE_CONFIG``'s
keys as read at registration, and the one-time log lines."""

from __future__ import annotations

import logging
from typing import Any

from stepscope import _plugin
from stepscope._plugin import CONFIG_ENV, stepscope_keys_from_env

logger = logging.getLogger("stepscope.vllm")

__all__ = ["CONFIG_ENV", "SWITCH_ENV", "enabled", "stepscope_keys_from_env"]

#: Set to ``0`` (or ``false``/``no``/``off``) to turn the plugin off.
SWITCH_ENV = "STEPSCOPE_VLLM"

#: ``STEPSCOPE_CONFIG``'s keys, read once at registration (None: not yet).
_stepscope_keys: dict[str, Any] | None = None


def enabled() -> bool:
    """False when ``STEPSCOPE_VLLM`` turns the plugin off."""
    return _plugin.switched_on(SWITCH_ENV)


def load_keys() -> None:
    """Reads ``STEPSCOPE_CONFIG``'s keys now (at registration); raises what
    :func:`stepscope_keys_from_env` raises."""
    global _stepscope_keys
    _stepscope_keys = stepscope_keys_from_env()


def stepscope_keys() -> dict[str, Any]:
    """``STEPSCOPE_CONFIG``'s keys: as read at registration, else read now."""
    return _stepscope_keys if _stepscope_keys is not None else stepscope_keys_from_env()


def key_on(name: str) -> bool:
    """``"stepscope": {name: ...}`` is set (and not false) in ``STEPSCOPE_CONFIG``; false too
    when that is bad (reported where the profiler is made)."""
    return _plugin.key_on(name, stepscope_keys)


#: The keys of the one-time info lines and warnings already logged.
_informed: set[str] = set()
_warned: set[str] = set()


def info_once(key: str, message: str, *args: Any) -> None:
    _plugin.once(logger, logging.INFO, _informed, key, message, *args)


def warn_once(key: str, message: str, *args: Any) -> None:
    _plugin.once(logger, logging.WARNING, _warned, key, message, *args)
