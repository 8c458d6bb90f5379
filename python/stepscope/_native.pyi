"""Type stubs of the native extension (bindings/python/src/lib.rs)."""

import os
from typing import Any, Mapping, Union

__version__: str

class ConfigError(ValueError):
    """A profiler config is invalid; the message names the field."""

    #: The offending key's dotted path (``"stepscope.nvtx"``), or None for malformed JSON.
    field: str | None
    #: Whether the key is one stepscope does not know (not a bad value of a known one).
    unknown_key: bool

class BackendError(RuntimeError):
    """A profiling backend failed."""

class StartRefused(RuntimeError):
    """A capture limit refused a start; nothing was armed."""

    #: The limit's key, e.g. ``"stepscope.min_free_disk_mb"``.
    key: str

class Iteration:
    """The counts of one engine iteration (context = prefill, generation = decode)."""

    def __init__(
        self,
        num_ctx_reqs: int = 0,
        num_ctx_tokens: int = 0,
        num_gen_reqs: int = 0,
        num_gen_tokens: int = 0,
        *,
        ctx_seq_len_sum: int | None = None,
        ctx_qq_compute: int | None = None,
        ctx_qk_compute: int | None = None,
        gen_seq_len_sum: int | None = None,
        gen_qq_compute: int | None = None,
        gen_qk_compute: int | None = None,
    ) -> None: ...
    @property
    def num_ctx_reqs(self) -> int: ...
    @property
    def num_ctx_tokens(self) -> int: ...
    @property
    def num_gen_reqs(self) -> int: ...
    @property
    def num_gen_tokens(self) -> int: ...
    @property
    def stage(self) -> str:
        """``prefill``, ``decode``, ``mixed`` or ``idle``."""
    def name(self, detailed: bool = False) -> str:
        """vLLM's annotation name of this iteration."""

class WorkerProfiler:
    def __init__(
        self,
        config: Union[Mapping[str, Any], str, os.PathLike[str]],
        worker_name: str,
        local_rank: int = 0,
        rank: int | None = None,
    ) -> None: ...
    def start(
        self,
        *,
        delay_iterations: int | None = None,
        max_iterations: int | None = None,
        start_at_step: int | None = None,
    ) -> None: ...
    def set_rank(self, rank: int) -> None: ...
    def status_json(self) -> str: ...
    def stop(self) -> None: ...
    def step(self, iteration: Iteration | None = None) -> None: ...
    def step_end(self) -> None: ...
    def timeline(
        self, since: int = 0
    ) -> list[tuple[int, int, int, int, int, int, int, str]] | None: ...
    def shutdown(self) -> None: ...
    def flush(self, timeout: float | None = None) -> bool: ...
    def set_output_name(self, name: str) -> None: ...
    def write_ticket(self) -> int: ...
    def _writes_since_json(self, ticket: int) -> str: ...
    def set_trace_name(self, name: str | None) -> bool:
        """Names the next capture's files exactly: ``{name}.trace.json.gz`` (``.json``
        without gzip), ``{name}.stepscope.json`` and ``{name}.profiler_out.txt``, in place of
        ``{worker}.{time_ns}.pt.trace.json.gz``; used by the next capture only. ``None`` drops
        a name not used yet. A name that is empty, starts with ``.`` or holds a path separator
        raises ValueError; while a session is active nothing changes and False is returned."""
    def _set_trace_metadata_json(self, key: str, json_value: str) -> None: ...
    def _reconfigure(self, config: Union[Mapping[str, Any], str, os.PathLike[str]]) -> bool: ...
    @property
    def config_json(self) -> str: ...
    @property
    def is_active(self) -> bool: ...
    @property
    def is_running(self) -> bool: ...
    @property
    def should_annotate(self) -> bool: ...
    @property
    def is_armed(self) -> bool: ...
    @property
    def has_timeline(self) -> bool: ...
    @property
    def pending_writes(self) -> int: ...
    @property
    def phase(self) -> str: ...
    @property
    def step_index(self) -> int: ...
    @property
    def worker_name(self) -> str: ...
    @property
    def local_rank(self) -> int: ...

MANIFEST_SUFFIX: str
MANIFEST_VERSION: int
TIMELINE_FIELDS: tuple[str, ...]

def manifest_trace_path(path: str | os.PathLike[str]) -> str: ...
def manifest_name(stem: str) -> str:
    """The manifest's file name for a trace stem: ``{stem}.stepscope.json``."""

def flushing_marker(pid: int) -> str: ...
def flushing_markers() -> dict[int, float]:
    """The flushing markers there are: ``{pid: flush timeout in seconds}``."""

def _read_manifest_json(path: str | os.PathLike[str]) -> str: ...
