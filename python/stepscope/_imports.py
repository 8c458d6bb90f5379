"""Patching a module when it is imported: a plugin names the modules it patches, and each patch
runs right after its module has executed (now, if it already has), in whichever process
imports it. Knows nothing of any engine."""

from __future__ import annotations

import importlib.abc
import logging
import sys
from types import ModuleType
from typing import Any, Callable

_hooks: dict[str, list[tuple[Callable[[ModuleType], None], logging.Logger, str]]] = {}


def when_imported(name: str, patch: Callable[[ModuleType], None], logger: logging.Logger, fallback: str) -> None:
    """Runs ``patch(module)`` now if ``name`` is imported, else right after its import, so
    processes that never import it pay nothing. A patch that raises is logged on ``logger``
    as a warning ending with ``fallback`` (what stays in place), and the import goes on."""
    module = sys.modules.get(name)
    if module is not None:
        _run(patch, module, logger, fallback)
        return
    _hooks.setdefault(name, []).append((patch, logger, fallback))
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def _run(
    patch: Callable[[ModuleType], None], module: ModuleType, logger: logging.Logger, fallback: str
) -> None:
    try:
        patch(module)
    except Exception:  # noqa: BLE001 - a failed patch must not break the engine's import
        logger.warning("stepscope: patching %s failed; %s", module.__name__, fallback, exc_info=True)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module it asks the other finders, then wraps the
    loader so the patches run once the module has executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            for patch, logger, fallback in _hooks.pop(fullname, []):
                _run(patch, module, logger, fallback)

        loader.exec_module = exec_then_patch  # type: ignore[union-attr]
        return spec
