"""vLLM plugin: vLLM's own ``--profiler-config`` drives stepscope in every worker.

Installed with the ``stepscope`` package as the ``vllm.general_plugins`` entry point
``stepscope = "stepscope.vllm:register"``; vLLM calls :func:`register` in each process it
starts. Then, in worker processes:

- ``create_worker_profiler`` (what ``vllm.v1.worker.gpu_worker.Worker.profile`` calls on
  ``/start_profile``) returns a :class:`stepscope.WorkerProfiler` for ``"profiler": "torch"`` and
  ``"cuda"`` (Proton stays vLLM's). Its ``stop()`` returns at once; the trace is written off the
  engine thread.
- ``Worker.annotate_profile`` hands each iteration's request and token counts to stepscope, so
  the NVTX range and the Kineto annotation carry vLLM's names (simple or detailed) and counts.

Environment:

- ``STEPSCOPE_VLLM=0`` turns the plugin off (vLLM's profilers stay).
- ``STEPSCOPE_CONFIG``: stepscope's own keys, as a config whose ``"stepscope"`` object is used
  (JSON text or a path), e.g. ``'{"stepscope": {"nvtx": "always"}}'``. vLLM's keys come from
  ``--profiler-config`` only; setting them here too is an error.

With the endpoint plugin also allowed (``VLLM_PLUGINS`` naming ``stepscope``; vLLM loads
endpoint plugins only when named), the API server answers ``GET /stepscope/status`` with every
engine worker's :meth:`stepscope.WorkerProfiler.status`, which ``stepscope ctl status`` shows.

If vLLM's names differ from what the plugin knows (another vLLM version), it logs one warning
and leaves vLLM untouched. :func:`register` is idempotent.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import importlib.abc
import inspect
import logging
import os
import re
import sys
import threading
import time
import weakref
from contextlib import nullcontext
from types import ModuleType
from typing import Any, Callable

logger = logging.getLogger("stepscope.vllm")

#: Set to ``0`` (or ``false``/``no``/``off``) to turn the plugin off.
SWITCH_ENV = "STEPSCOPE_VLLM"
#: stepscope's own keys: a config whose ``"stepscope"`` object is used.
CONFIG_ENV = "STEPSCOPE_CONFIG"

_WRAPPER = "vllm.profiler.wrapper"
_GPU_WORKER = "vllm.v1.worker.gpu_worker"
_ASYNC_LLM = "vllm.v1.engine.async_llm"
_ENGINE_UTILS = "vllm.v1.engine.utils"
_V1_UTILS = "vllm.v1.utils"
_MULTIPROC_EXECUTOR = "vllm.v1.executor.multiproc_executor"
_PATCHED_MARK = "__stepscope_original__"

_lock = threading.Lock()
_registered = False
_stepscope_keys: dict[str, Any] | None = None


def register() -> None:
    """vLLM's plugin entry point. Patches vLLM's profiler factory and ``annotate_profile`` as
    their modules are imported (now, if they already are)."""
    global _registered, _stepscope_keys
    with _lock:
        if _registered:
            return
        if not enabled():
            logger.info("stepscope: %s=%s, vLLM's profilers stay", SWITCH_ENV, os.environ[SWITCH_ENV])
            return
        try:
            _stepscope_keys = stepscope_keys_from_env()
        except ValueError as e:
            logger.error("stepscope: %s; vLLM's profilers stay", e)
            return
        _registered = True
    _when_imported(_WRAPPER, _patch_wrapper)
    _when_imported(_GPU_WORKER, _patch_gpu_worker)
    _when_imported(_ASYNC_LLM, _patch_async_llm)
    _when_imported(_V1_UTILS, _patch_process_shutdown)
    _when_imported(_ENGINE_UTILS, _patch_process_shutdown)
    _when_imported(_MULTIPROC_EXECUTOR, _patch_multiproc_executor)


def enabled() -> bool:
    """False when ``STEPSCOPE_VLLM`` turns the plugin off."""
    value = os.environ.get(SWITCH_ENV, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def stepscope_keys_from_env() -> dict[str, Any]:
    """The ``"stepscope"`` object of ``STEPSCOPE_CONFIG`` (empty when unset).

    Only its form is checked here (readable, JSON, an object holding only ``"stepscope"``);
    the keys' values are validated with vLLM's fields when a worker's profiler is made, since
    some depend on them (``repeat`` needs ``max_iterations``). Raises
    :class:`stepscope.ConfigError` (a ``ValueError``) naming what is wrong.
    """
    import json

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


def config_dict(profiler_config: Any) -> dict[str, Any]:
    """vLLM's ``ProfilerConfig`` as stepscope's config: every vLLM field, plus the
    ``"stepscope"`` keys of ``STEPSCOPE_CONFIG``."""
    fields = {f.name: getattr(profiler_config, f.name) for f in dataclasses.fields(profiler_config)}
    keys = _stepscope_keys if _stepscope_keys is not None else stepscope_keys_from_env()
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
                _warn_once(
                    f"field:{field}",
                    "stepscope: vLLM's ProfilerConfig field %s is %r, which this stepscope "
                    "does not know (vLLM %s); vLLM's own profiler serves this process",
                    field,
                    value,
                    _vllm_version(),
                )
                raise
            _info_once(
                f"field:{field}",
                "stepscope: vLLM's ProfilerConfig field %s (vLLM %s) is not one this stepscope "
                "knows; at its default (%r), left out",
                field,
                _vllm_version(),
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


_informed: set[str] = set()


def _info_once(key: str, message: str, *args: Any) -> None:
    if key not in _informed:
        _informed.add(key)
        logger.info(message, *args)


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


# --- vllm.profiler.wrapper.create_worker_profiler --------------------------------------------


def _make_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_worker_profiler(
        profiler_config: Any, *, worker_name: str, local_rank: int, **extra: Any
    ) -> Any:
        # extra: what this vLLM's factory takes beyond 0.32's (0.33: profiler_kwargs), checked
        # against its signature when patched.
        def vllms_own() -> Any:
            return original(profiler_config, worker_name=worker_name, local_rank=local_rank, **extra)

        kind = getattr(profiler_config, "profiler", None)
        if kind not in ("torch", "cuda"):
            return vllms_own()
        if kind == "torch":
            why = torch_unavailable()
            if why is not None:
                _warn_once(
                    "torch-glue",
                    "stepscope: the torch backend cannot run here (%s); vLLM's own torch "
                    "profiler stays (\"cuda\" is still stepscope's)",
                    why,
                )
                return vllms_own()
        import stepscope

        try:
            profiler = build_profiler(profiler_config, worker_name=worker_name, local_rank=local_rank)
        except stepscope.ConfigError as e:
            # A vLLM field this stepscope does not accept: vLLM's own profiler honours it.
            if not getattr(e, "unknown_key", False):
                logger.warning("stepscope: %s; using vLLM's own profiler for %s", e, worker_name)
            return vllms_own()
        if extra.get("profiler_kwargs"):
            profiler.set_profiler_kwargs(extra["profiler_kwargs"])
        return profiler

    create_worker_profiler.__doc__ = "stepscope's profiler for torch and cuda (stepscope.vllm)."
    setattr(create_worker_profiler, _PATCHED_MARK, original)
    return create_worker_profiler


_torch_unavailable: list[str | None] = []


def torch_unavailable() -> str | None:
    """Why stepscope's torch backend cannot run in this process (see
    :func:`stepscope.torch_backend_error`), asked once per process."""
    if not _torch_unavailable:
        import stepscope

        _torch_unavailable.append(stepscope.torch_backend_error())
    return _torch_unavailable[0]


_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


# --- the interfaces the plugin replaces or drives, as vLLM 0.32 and 0.33 declare them ---------

_POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KW = inspect.Parameter.KEYWORD_ONLY
#: Parameter (name, kind) lists the plugin knows, per patched callable. Another vLLM with
#: other signatures: one warning, and vLLM's own profiler.
KNOWN_SIGNATURES: dict[str, list[tuple[tuple[str, Any], ...]]] = {
    "create_worker_profiler": [
        (("profiler_config", _POS), ("worker_name", _KW), ("local_rank", _KW)),  # 0.32
        (("profiler_config", _POS), ("worker_name", _KW), ("local_rank", _KW),
         ("profiler_kwargs", _KW)),  # 0.33
    ],
    "create_frontend_profiler": [(("profiler_config", _POS), ("worker_name", _KW))],
    "Worker.annotate_profile": [(("self", _POS), ("scheduler_output", _POS))],
    "Worker.profile": [
        (("self", _POS), ("is_start", _POS), ("profile_prefix", _POS),
         ("delay_iterations", _KW), ("max_iterations", _KW)),  # 0.32
        (("self", _POS), ("is_start", _POS), ("profile_prefix", _POS),
         ("delay_iterations", _KW), ("max_iterations", _KW), ("profiler_kwargs", _KW)),  # 0.33
    ],
    "shutdown": [(("procs", _POS), ("timeout", _POS))],
    "MultiprocExecutor._ensure_worker_termination": [(("worker_procs", _POS),)],
}  # fmt: skip


def signature_of(fn: Any) -> tuple[tuple[str, Any], ...] | None:
    """``fn``'s parameters as (name, kind) pairs; None when it has no signature."""
    try:
        params = inspect.signature(inspect.unwrap(fn)).parameters.values()
    except (TypeError, ValueError):
        return None
    return tuple((p.name, p.kind) for p in params)


def signature_known(name: str, fn: Any, module: ModuleType) -> bool:
    """Whether ``fn`` (``name`` in KNOWN_SIGNATURES) has a signature the plugin knows; else
    one warning naming it, and False (the caller leaves vLLM's code in place)."""
    sig = signature_of(fn)
    if sig in KNOWN_SIGNATURES[name]:
        return True
    shown = "(" + ", ".join(n for n, _ in sig) + ")" if sig is not None else "(unreadable)"
    _warn_once(
        f"signature:{name}",
        "stepscope: %s.%s%s is not a signature this stepscope knows (vLLM %s); vLLM's own "
        "profiler stays in place",
        module.__name__,
        name,
        shown,
        _vllm_version(),
    )
    return False


def _vllm_version() -> str:
    try:
        import vllm.version

        return str(vllm.version.__version__)
    except Exception:  # noqa: BLE001 - only for a message
        return "unknown"


def rank_of(worker_name: str) -> int | None:
    """The global rank in vLLM's worker name (``…_rank{N}``, from ``get_worker_rank_suffix``);
    ``None`` when absent (then the ``RANK`` environment variable is used)."""
    match = re.search(r"rank(\d+)$", worker_name)
    return int(match.group(1)) if match else None


def _patch_wrapper(module: ModuleType) -> None:
    original = getattr(module, "create_worker_profiler", None)
    if original is None:
        _warn_unpatched(module, "create_worker_profiler")
    elif not hasattr(original, _PATCHED_MARK) and signature_known(
        "create_worker_profiler", original, module
    ):
        module.create_worker_profiler = _make_factory(original)
    frontend = getattr(module, "create_frontend_profiler", None)
    if (
        frontend is not None
        and not hasattr(frontend, _PATCHED_MARK)
        and signature_known("create_frontend_profiler", frontend, module)
    ):
        module.create_frontend_profiler = _make_frontend_factory(frontend)


# --- the API server's frontend profiler (ignore_frontend: false) -------------------------------

#: Capture-control keys mean nothing to the frontend, which has no engine iterations.
_ITERATION_KEYS = ("ranks", "start_at_step", "stages", "repeat", "repeat_every",
                   "min_batch_requests", "min_batch_tokens")


def _make_frontend_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_frontend_profiler(profiler_config: Any, *, worker_name: str) -> Any:
        if getattr(profiler_config, "profiler", None) != "torch" or torch_unavailable():
            return original(profiler_config, worker_name=worker_name)
        try:
            return FrontendProfiler(profiler_config, worker_name)
        except Exception as e:  # noqa: BLE001 - vLLM's own profiler takes over
            if not getattr(e, "unknown_key", False):  # else warned once already
                logger.warning(
                    "stepscope: %s; using vLLM's own profiler for the API server (%s)",
                    e,
                    worker_name,
                )
            return original(profiler_config, worker_name=worker_name)

    create_frontend_profiler.__doc__ = "stepscope's profiler for the API server (stepscope.vllm)."
    setattr(create_frontend_profiler, _PATCHED_MARK, original)
    return create_frontend_profiler


class _OwnThread:
    """One daemon thread running the calls given to :meth:`run`, one at a time. Not a
    ThreadPoolExecutor: an executor refuses work once the interpreter begins to exit, before
    ``atexit`` handlers run, and Kineto's session must be stopped on the thread that began it."""

    def __init__(self, name: str) -> None:
        import queue

        self._calls: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.Queue()
        )
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, future = self._calls.get()
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)

    def run(self, fn: Callable[[], Any]) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._calls.put((fn, future))
        return future.result()


class FrontendProfiler:
    """The API server's CPU profiler around ``AsyncLLM`` (vLLM's ``create_frontend_profiler``,
    used while ``ignore_frontend`` is false), as stepscope's: ``stop()`` returns once Kineto has
    let go of the session, and the trace is written in the background.

    vLLM calls ``start``/``stop`` through ``asyncio.to_thread``, so on any thread of a pool;
    Kineto's session belongs to the thread that enabled it. Both run here on one thread of
    this profiler's own.
    """

    def __init__(self, profiler_config: Any, worker_name: str) -> None:
        import stepscope

        config = config_dict(profiler_config)
        config.update(
            delay_iterations=0,
            max_iterations=0,
            wait_iterations=0,
            warmup_iterations=0,
            torch_profiler_activities=["CPU"],
        )
        keys = {k: v for k, v in config.get("stepscope", {}).items() if k not in _ITERATION_KEYS}
        config["stepscope"] = keys
        self._profiler = make_with_known_fields(
            profiler_config,
            config,
            lambda c: stepscope.WorkerProfiler(c, worker_name=worker_name),
        )
        add_version_metadata(self._profiler)
        self._thread = _OwnThread("stepscope-frontend")
        # A session still running when the API server exits (a /start_profile nobody stopped)
        # is stopped and written first: torch's profiler state destroyed at exit with its
        # session on crashed the process (segfault in ~ProfilerStateBase).
        ref = weakref.ref(self)
        atexit.register(lambda: (p := ref()) is not None and p._at_exit())
        logger.info(
            "stepscope: the API server's CPU trace is stepscope's (written off the request "
            "path) under %s",
            profiler_config.torch_profiler_dir,
        )

    def _on_thread(self, fn: Callable[[], Any]) -> Any:
        return self._thread.run(fn)

    def _at_exit(self) -> None:
        try:
            if self._profiler.is_active:
                logger.info("stepscope: the API server exits with its profile running: stopped")
            self._on_thread(self._profiler.shutdown)
        except Exception:  # noqa: BLE001 - exiting anyway
            logger.debug("stepscope: the frontend's shutdown at exit failed", exc_info=True)

    def start(self) -> None:
        self._on_thread(self._profiler.start)

    def stop(self) -> None:
        self._on_thread(self._profiler.stop)

    def shutdown(self) -> None:
        self._on_thread(self._profiler.shutdown)

    def set_output_name(self, worker_name: str) -> None:
        self._profiler.set_output_name(worker_name)

    @property
    def profiler(self) -> Any:
        """The stepscope profiler behind it."""
        return self._profiler

    def __getattr__(self, name: str) -> Any:
        # Anything else vLLM may read (is_running, should_annotate, ...) is the profiler's.
        return getattr(self._profiler, name)


def _patch_async_llm(module: ModuleType) -> None:
    # AsyncLLM imported create_frontend_profiler by name before the wrapper was patched.
    factory = getattr(module, "create_frontend_profiler", None)
    if factory is None or hasattr(factory, _PATCHED_MARK):
        return
    if not signature_known("create_frontend_profiler", factory, module):
        return
    wrapper = sys.modules.get(_WRAPPER)
    patched = getattr(wrapper, "create_frontend_profiler", None)
    module.create_frontend_profiler = (
        patched if hasattr(patched, _PATCHED_MARK) else _make_frontend_factory(factory)
    )


# --- shutdown: process managers wait while a child writes its traces ---------------------------


def _patch_process_shutdown(module: ModuleType) -> None:
    """The API server's ``CoreEngineProcManager`` ends engine processes with ``shutdown(procs,
    timeout)`` (``vllm.v1.utils``, imported by name into ``vllm.v1.engine.utils``): SIGTERM, a
    grace period (none under vLLM's default ``shutdown_timeout``), then SIGKILL to the whole
    process tree. Ours first gives a process with traces in flight (a flushing marker, its own
    or a worker's below it) up to the marker's flush timeout to finish them and exit."""
    original = getattr(module, "shutdown", None)
    if original is None or hasattr(original, _PATCHED_MARK):
        return
    if not signature_known("shutdown", original, module):
        return

    def shutdown(procs: list[Any], timeout: float | None = None) -> None:
        try:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            wait_for_flushes(procs, grace=5.0 if timeout is None else timeout)
        except Exception:  # noqa: BLE001 - vLLM's own shutdown must still run
            logger.debug("stepscope: waiting for trace writers failed", exc_info=True)
        original(procs, timeout=timeout)

    shutdown.__doc__ = original.__doc__
    setattr(shutdown, _PATCHED_MARK, original)
    module.shutdown = shutdown


def _patch_multiproc_executor(module: ModuleType) -> None:
    """The engine process ends its workers with ``_ensure_worker_termination``: a grace period
    (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``), SIGTERM, 4 s, SIGKILL. A SIGTERM interrupts a
    worker still writing its traces; ours waits for such a worker first."""
    executor = getattr(module, "MultiprocExecutor", None)
    original = getattr(executor, "_ensure_worker_termination", None)
    if original is None or hasattr(original, _PATCHED_MARK):
        return
    if not signature_known("MultiprocExecutor._ensure_worker_termination", original, module):
        return

    def _ensure_worker_termination(worker_procs: list[Any]) -> None:
        try:
            grace = float(os.environ.get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "5"))
            wait_for_flushes(worker_procs, grace=grace)
        except Exception:  # noqa: BLE001 - vLLM's own termination must still run
            logger.debug("stepscope: waiting for trace writers failed", exc_info=True)
        original(worker_procs)

    setattr(_ensure_worker_termination, _PATCHED_MARK, original)
    executor._ensure_worker_termination = staticmethod(_ensure_worker_termination)


def wait_for_flushes(procs: list[Any], *, grace: float) -> None:
    """Waits up to ``grace`` seconds for ``procs`` (multiprocessing processes) to exit, and
    longer while one still alive has traces in flight (a flushing marker of its own or of a
    descendant; see :func:`stepscope.flushing_marker`): up to the marker's flush timeout."""
    start = time.monotonic()
    announced = False
    while True:
        alive = [p.pid for p in procs if p.is_alive()]
        if not alive:
            return
        timeout = _flushing_timeout(alive)
        waited = time.monotonic() - start
        if waited >= max(grace, timeout or 0.0):
            return
        if timeout is not None and not announced:
            logger.info(
                "stepscope: waiting up to %.0f s for traces being written before the "
                "process ends",
                timeout - waited,
            )
            announced = True
        time.sleep(0.05)


def _flushing_timeout(pids: list[int]) -> float | None:
    """The longest flush timeout among the flushing markers of live processes that are one of
    ``pids`` or descend from one; None when there is none."""
    import glob

    import stepscope

    roots = set(pids)
    longest = None
    prefix = stepscope.flushing_marker(0)[:-1]
    for path in glob.glob(prefix + "*"):
        try:
            pid = int(path[len(prefix) :])
            with open(path, encoding="utf-8") as f:
                timeout = float(f.read().strip() or 0)
        except (ValueError, OSError):
            continue
        if _descends_from(pid, roots):
            longest = timeout if longest is None else max(longest, timeout)
    return longest


def _descends_from(pid: int, roots: set[int]) -> bool:
    """Whether live process ``pid`` is in ``roots`` or below one of them (Linux's /proc)."""
    for _ in range(64):
        if pid in roots:
            return True
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            return False
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if pid <= 1:
            return False
    return False


# --- vllm.v1.worker.gpu_worker -----------------------------------------------------------------


def _patch_gpu_worker(module: ModuleType) -> None:
    worker = getattr(module, "Worker", None)
    original_annotate = getattr(worker, "annotate_profile", None)
    factory = getattr(module, "create_worker_profiler", None)
    try:
        from vllm.v1.utils import compute_iteration_details
    except ImportError:
        compute_iteration_details = None
    missing = [
        name
        for name, found in (
            ("Worker.annotate_profile", original_annotate),
            ("create_worker_profiler", factory),
            ("vllm.v1.utils.compute_iteration_details", compute_iteration_details),
        )
        if found is None
    ]
    if missing:
        _warn_unpatched(module, ", ".join(missing))
        return
    # How the worker drives its profiler (profile) and hands it iterations (annotate_profile)
    # must be as the plugin knows it; the factory it calls too.
    if not all(
        hasattr(fn, _PATCHED_MARK) or signature_known(name, fn, module)
        for name, fn in (
            ("Worker.profile", getattr(worker, "profile", None)),
            ("Worker.annotate_profile", original_annotate),
            ("create_worker_profiler", factory),
        )
    ):
        return
    if not hasattr(factory, _PATCHED_MARK):
        # gpu_worker imported the factory by name before the wrapper module was patched.
        wrapper = sys.modules.get(_WRAPPER)
        patched = getattr(wrapper, "create_worker_profiler", None)
        module.create_worker_profiler = (
            patched if hasattr(patched, _PATCHED_MARK) else _make_factory(factory)
        )
    if not hasattr(original_annotate, _PATCHED_MARK):
        worker.annotate_profile = _make_annotate(original_annotate, compute_iteration_details)
    if not hasattr(worker, "stepscope_status"):
        worker.stepscope_status = worker_status


def _make_annotate(original: Callable[..., Any], compute_iteration_details: Any) -> Callable[..., Any]:
    import stepscope

    def annotate_profile(self: Any, scheduler_output: Any) -> Any:
        profiler = getattr(self, "profiler", None)
        if not isinstance(profiler, stepscope.WorkerProfiler):
            return original(self, scheduler_output)
        if not profiler.is_armed:
            # Nothing will read counts: skip computing them (vLLM's idle cost).
            profiler.step()
            return _IDLE
        detailed = bool(getattr(self.vllm_config.profiler_config, "detailed_trace_annotation", False))
        # Request ids are read only when stepscope.request_ids asks for them.
        ids = request_ids_of(scheduler_output) if profiler.wants_request_ids else None
        profiler.step(iteration_of(scheduler_output, compute_iteration_details, detailed, ids))
        return _IterationScope(profiler)

    annotate_profile.__doc__ = original.__doc__
    annotate_profile.__name__ = "annotate_profile"
    annotate_profile.__qualname__ = getattr(original, "__qualname__", "annotate_profile")
    setattr(annotate_profile, _PATCHED_MARK, original)
    return annotate_profile


def worker_status(self: Any) -> dict[str, Any]:
    """``Worker.stepscope_status``, for ``collective_rpc("stepscope_status")``: the worker's
    profiler status, or what is known before its first ``/start_profile``."""
    import stepscope

    profiler = getattr(self, "profiler", None)
    if isinstance(profiler, stepscope.WorkerProfiler):
        return profiler.status()
    config = getattr(self, "profiler_config", None)
    return {
        "rank": getattr(self, "rank", None),
        "backend": getattr(config, "profiler", None),
        "phase": "not_created",
        "note": "no /start_profile has reached this worker yet"
        if profiler is None
        else f"vLLM's own {type(profiler).__name__} profiles this worker",
    }


class StatusEndpoint:
    """The ``vllm.endpoint_plugins`` entry point: ``GET /stepscope/status`` on the API server,
    answering ``{"workers": [status, ...]}`` from every engine worker (through vLLM's
    ``collective_rpc``, to the method the general plugin installs)."""

    name = "stepscope"
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        from fastapi import Request
        from fastapi.responses import JSONResponse

        async def stepscope_status(request):  # type: ignore[no-untyped-def]
            engine = getattr(request.app.state, "stepscope_engine_client", None)
            if engine is None:
                return JSONResponse({"error": "this server has no engine"}, status_code=503)
            try:
                workers = await engine.collective_rpc("stepscope_status")
            except Exception as e:  # noqa: BLE001 - reported to the caller, not raised
                return JSONResponse(
                    {"error": f"collective_rpc('stepscope_status') failed: {e}"}, status_code=500
                )
            return JSONResponse({"workers": list(workers)})

        # Real classes, not the strings this module's annotations become: FastAPI reads them
        # to pass the request in.
        stepscope_status.__annotations__ = {"request": Request, "return": JSONResponse}
        app.add_api_route("/stepscope/status", stepscope_status, methods=["GET"])

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        state.stepscope_engine_client = engine_client


# nullcontext keeps no state, so one serves every idle iteration.
_IDLE = nullcontext()


class _IterationScope:
    """Closes the iteration's NVTX range and Kineto annotation when the model step ends."""

    __slots__ = ("_profiler",)

    def __init__(self, profiler: Any) -> None:
        self._profiler = profiler

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._profiler.step_end()


def request_ids_of(scheduler_output: Any) -> list[str]:
    """The ids of the requests one ``SchedulerOutput`` schedules, in its order: the keys of
    ``num_scheduled_tokens`` (new and cached requests alike)."""
    return [str(r) for r in scheduler_output.num_scheduled_tokens]


def iteration_of(
    scheduler_output: Any,
    compute_iteration_details: Any,
    detailed: bool,
    request_ids: list[str] | None = None,
) -> Any:
    """The :class:`stepscope.Iteration` of one ``SchedulerOutput``: vLLM's own
    ``compute_iteration_details`` counts (context = a new request or one still in its context
    phase), with ``detailed`` vLLM's per-phase roofline sums, and the request ids if given."""
    import stepscope

    d = compute_iteration_details(scheduler_output)
    counts = (
        d.num_ctx_requests,
        d.num_ctx_tokens,
        d.num_generation_requests,
        d.num_generation_tokens,
    )
    if not detailed:
        return stepscope.Iteration(*counts, request_ids=request_ids)
    new_ids = {r.req_id for r in scheduler_output.scheduled_new_reqs}
    computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
    ctx = [0, 0, 0]
    gen = [0, 0, 0]
    for req_id, q in scheduler_output.num_scheduled_tokens.items():
        seq = computed.get(req_id, 0) + q
        sums = ctx if (req_id in new_ids or cached.is_context_phase(req_id)) else gen
        sums[0] += seq
        sums[1] += q * q
        sums[2] += q * seq
    return stepscope.Iteration(
        *counts,
        ctx_seq_len_sum=ctx[0],
        ctx_qq_compute=ctx[1],
        ctx_qk_compute=ctx[2],
        gen_seq_len_sum=gen[0],
        gen_qq_compute=gen[1],
        gen_qk_compute=gen[2],
        request_ids=request_ids,
    )


def _warn_unpatched(module: ModuleType, names: str) -> None:
    logger.warning(
        "stepscope: %s has no %s (a vLLM version this stepscope does not know); "
        "vLLM's own profiler stays in place",
        module.__name__,
        names,
    )


# --- patch a module when it is imported --------------------------------------------------------

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}


def _when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Runs ``patch(module)`` now if ``name`` is imported, else right after its import, so
    processes that never import it (vLLM's API server) pay nothing."""
    module = sys.modules.get(name)
    if module is not None:
        _run(patch, module)
        return
    _hooks.setdefault(name, []).append(patch)
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def _run(patch: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        patch(module)
    except Exception:  # noqa: BLE001 - a failed patch must not break vLLM's import
        logger.warning(
            "stepscope: patching %s failed; vLLM's own profiler stays in place",
            module.__name__,
            exc_info=True,
        )


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
            for patch in _hooks.pop(fullname, []):
                _run(patch, module)

        loader.exec_module = exec_then_patch  # type: ignore[union-attr]
        return spec


# --- python -m stepscope.vllm --check ----------------------------------------------------------


def check() -> int:
    """What ``python -m stepscope.vllm --check`` prints: the versions found, whether the plugin
    is installed and its patches apply to this vLLM, and which backends can run. Returns the
    exit status: 0 when the plugin takes over vLLM's profiler here."""
    import importlib.metadata as md
    import platform

    import stepscope

    ok = True

    def line(label: str, value: str) -> None:
        print(f"{label:<28} {value}")

    line("stepscope", f"{stepscope.__version__} ({os.path.dirname(stepscope.__file__)})")
    line("python", f"{platform.python_version()} ({sys.executable})")
    try:
        import torch

        line("torch", f"{torch.__version__} ({os.path.dirname(torch.__file__)})")
    except ImportError as e:
        line("torch", f"not importable ({e})")
    try:
        vllm_version = md.version("vllm")
    except md.PackageNotFoundError:
        line("vllm", "not installed: nothing to patch")
        return 1
    line("vllm", vllm_version)
    points = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "stepscope"]
    line("plugin entry point", points[0].value if points else "MISSING (reinstall stepscope)")
    ok &= bool(points)
    if not enabled():
        line("plugin", f"switched off ({SWITCH_ENV}={os.environ[SWITCH_ENV]})")
        ok = False
    try:
        keys = stepscope_keys_from_env()
        line(CONFIG_ENV, json_text(keys) if keys else "(unset)")
    except ValueError as e:
        line(CONFIG_ENV, f"ERROR: {e}")
        ok = False

    # The patches, applied as a vLLM process applies them, then read back.
    register()
    import importlib

    patched: dict[str, bool] = {}
    for label, module_name, attr in (
        ("create_worker_profiler", _WRAPPER, "create_worker_profiler"),
        ("create_frontend_profiler", _WRAPPER, "create_frontend_profiler"),
        ("Worker.annotate_profile", _GPU_WORKER, "Worker.annotate_profile"),
        ("shutdown wait", _V1_UTILS, "shutdown"),
        ("worker termination wait", _MULTIPROC_EXECUTOR, "MultiprocExecutor._ensure_worker_termination"),
    ):
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
            patched[label] = hasattr(obj, _PATCHED_MARK)
            state = "patched" if patched[label] else "NOT patched (see the warning above)"
        except Exception as e:  # noqa: BLE001 - reported, the check goes on
            patched[label] = False
            state = f"NOT patched: {module_name} does not import here ({type(e).__name__}: {e})"
        line(label, state)
    ok &= patched["create_worker_profiler"] and patched["Worker.annotate_profile"]

    why = stepscope.torch_backend_error()
    if why is None:
        glue = stepscope.kineto_glue()
        line('"profiler": "torch"', f"stepscope's (Kineto glue {glue['path']}, built for torch {glue['built_for']})")
    else:
        line('"profiler": "torch"', f"vLLM's own: {why}")
    line('"profiler": "cuda"', "stepscope's (" + _cuda_driver() + ")")
    line("verdict", "the plugin takes over vLLM's profiler here" if ok else "the plugin does NOT take over here")
    return 0 if ok else 1


def json_text(value: Any) -> str:
    import json

    return json.dumps(value)


def _cuda_driver() -> str:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return "CUDA driver libcuda.so.1 found"
    except OSError:
        return "no CUDA driver here: start would fail with a message"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m stepscope.vllm",
        description="stepscope's vLLM plugin. --check: the vLLM and torch versions found, "
        "whether the plugin's patches apply to this vLLM, and which backends can run.",
    )
    parser.add_argument("--check", action="store_true", help="check this environment (exit 0: the plugin takes over)")
    args = parser.parse_args(argv)
    if not args.check:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return check()


if __name__ == "__main__":
    # Run as a script the module is __main__: use the real stepscope.vllm, whose state vLLM's
    # imports see.
    from stepscope import vllm as _plugin

    sys.exit(_plugin.main())
