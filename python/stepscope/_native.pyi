"""Type stubs of the native extension (bindings/python/src/lib.rs). `make test` checks them
against the built extension with mypy's stubtest: a name or signature that differs fails."""

import os
from typing import Any, Iterable, Mapping, Sequence, Union

from typing_extensions import Self, disjoint_base, final

__all__ = [
    "WorkerProfiler",
    "Iteration",
    "RequestLog",
    "_add_kineto_glue_dir",
    "kineto_glue",
    "read_manifest",
    "_op_table",
    "stepscope_keys_from_env",
    "request_log_name",
    "otel_settings",
    "engine_log_stem",
    "manifest_name",
    "manifest_trace_path",
    "flushing_marker",
    "flushing_markers",
    "MANIFEST_SUFFIX",
    "MANIFEST_VERSION",
    "TIMELINE_FIELDS",
    "ConfigError",
    "BackendError",
    "StartRefused",
    "__version__",
    "DEFAULT_FLUSH_TIMEOUT_S",
]

__version__: str
#: ``stepscope.flush_timeout_s``'s default, s (the Rust config's; written there only).
DEFAULT_FLUSH_TIMEOUT_S: float

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

@final
class Iteration:
    """The counts of one engine iteration (context = prefill, generation = decode)."""

    def __new__(
        cls,
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
        request_ids: list[str] | None = None,
        request_tokens: list[int] | None = None,
        request_prefill: list[bool] | None = None,
        request_computed: list[int] | None = None,
        request_outputs: list[int] | None = None,
    ) -> Self: ...
    @property
    def request_ids(self) -> list[str] | None:
        """The ids of the requests this iteration serves, if given: recorded for captured
        iterations with ``"stepscope": {"request_ids": true}``."""
    @property
    def request_tokens(self) -> list[int] | None:
        """The tokens scheduled for each request, in the order of ``request_ids``, if given."""
    @property
    def request_prefill(self) -> list[bool] | None:
        """Whether each request is in prefill (else decode), in the order of ``request_ids``,
        if given."""
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

@disjoint_base
class WorkerProfiler:
    def __new__(
        cls,
        config: Union[Mapping[str, Any], str, os.PathLike[str]],
        worker_name: str,
        local_rank: int = 0,
        rank: int | None = None,
    ) -> Self: ...
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
    def timeline_json(self, since: int = 0, last: int | None = None) -> str:
        """The timeline as the engine plugins serve it: ``{"worker_name", "rank", "phase",
        "step_index", "now_unix_ns", "timeline", "fields", "steps"}``."""
    def shutdown(self) -> None: ...
    def flush(self, timeout: float | None = None) -> bool: ...
    def set_output_name(self, name: str) -> None: ...
    def write_ticket(self) -> int: ...
    def writes_since(self, ticket: int) -> dict[str, Any]:
        """Where the traces since ``ticket`` (``write_ticket``, taken before a stop) stand:
        ``{"settled", "stopping", "pending_writes", "traces": [...]}``."""
    def status(self) -> dict[str, Any]:
        """The profiler's state as a dict (``phase``, ``step_index``, the window, the capture
        budget, ``pending_writes``, ``rank``, ``last_error``, ...)."""
    def timeline_dict(self, since: int = 0, last: int | None = None) -> dict[str, Any]:
        """``timeline_json``'s document as a dict."""
    def set_trace_name(self, name: str | None) -> bool:
        """Names the next capture's files exactly: ``{name}.trace.json.gz`` (``.json``
        without gzip), ``{name}.stepscope.json`` and ``{name}.profiler_out.txt``, in place of
        ``{worker}.{time_ns}.pt.trace.json.gz``; used by the next capture only. ``None`` drops
        a name not used yet. A name that is empty, starts with ``.`` or holds a path separator
        raises ValueError; while a session is active nothing changes and False is returned."""
    def _set_trace_metadata_json(self, key: str, json_value: str) -> None: ...
    def _set_model(
        self,
        config_json: str,
        *,
        tensor_parallel: int | None = None,
        weight_dtype: str | None = None,
        kv_cache_dtype: str | None = None,
        params: int | None = None,
    ) -> dict[str, Any]: ...
    def _reconfigure(self, config: Union[Mapping[str, Any], str, os.PathLike[str]]) -> bool: ...
    @property
    def config_json(self) -> str:
        """The config the next session uses, every field filled in (``set_profiler_kwargs``
        applied)."""
    @property
    def config(self) -> dict[str, Any]:
        """The config the next session uses, every field filled in, as a dict (a copy)."""
    @property
    def base_config(self) -> dict[str, Any]:
        """The config the profiler was made with, as a dict."""
    @property
    def base_config_json(self) -> str:
        """The config the profiler was made with."""
    @property
    def flush_timeout_s(self) -> float:
        """``stepscope.flush_timeout_s`` of the config the next session uses."""
    @property
    def wants_request_ids(self) -> bool:
        """Whether the next ``step()`` can record request ids: collect them only then."""
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

@final
class RequestLog:
    """Each request's lifecycle in the engine and the engine steps it lived through."""

    def __new__(cls, requests: int = 4096, steps: int = 4096) -> RequestLog: ...
    @staticmethod
    def from_config(config: Mapping[str, Any] | str | os.PathLike[str]) -> RequestLog | None: ...
    @property
    def capacity(self) -> tuple[int, int]: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def step_index(self) -> int: ...
    def arrived(self, id: str, prompt_tokens: int, arrival_time: float | None = None) -> None: ...
    def begin_step(self, waiting: int = 0) -> int: ...
    def scheduled(
        self,
        step: int,
        ids: Iterable[str],
        tokens: Iterable[int],
        computed: Iterable[int],
        prefill: Iterable[bool] | None = None,
        outputs: Iterable[int] | None = None,
    ) -> None: ...
    def preempted(self, step: int, ids: Iterable[str]) -> None: ...
    def discard_step(self, step: int) -> bool: ...
    def end_step(self, step: int) -> None: ...
    def produced(self, step: int, ids: Iterable[str], tokens: Iterable[int]) -> None: ...
    def finished(self, step: int | None, id: str, reason: str) -> None: ...
    def document_json(self, since: int = 0) -> str: ...
    def document(self, since: int = 0) -> dict[str, Any]: ...
    def spans_otlp(
        self,
        wanted: Sequence[tuple[str, str | None, str | None]],
        *,
        salt: int,
        costliest: int | None = None,
        steps_after: int | None = None,
        protobuf: bool = False,
    ) -> tuple[str | bytes, int, int, int | None, int]: ...
    def write_json(self, path: str | os.PathLike[str], since: int = 0) -> None: ...

MANIFEST_SUFFIX: str
MANIFEST_VERSION: int
TIMELINE_FIELDS: tuple[str, ...]

def otel_settings(config: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any] | None: ...
def manifest_trace_path(path: str | os.PathLike[str]) -> str: ...
def manifest_name(stem: str) -> str:
    """The manifest's file name for a trace stem: ``{stem}.stepscope.json``."""

def flushing_marker(pid: int) -> str: ...
def flushing_markers() -> dict[int, float]:
    """The flushing markers there are: ``{pid: flush timeout in seconds}``."""

def request_log_name(stem: str) -> str:
    """A window's request log's file name: ``{stem}.requests.json``."""
def engine_log_stem(engine: int, stop_ns: int) -> str:
    """An engine core's window log's stem: ``engine{N}.{stop ns}``."""
def stepscope_keys_from_env() -> dict[str, Any]:
    """The ``"stepscope"`` object of ``STEPSCOPE_CONFIG`` (empty when unset); raises
    ``ConfigError`` naming what is wrong."""
def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest at ``path`` as a dict, read through the library's manifest type; raises
    ``OSError`` when it cannot be read and ``ValueError`` (naming the file) when it is not a
    manifest."""

def _op_table(
    events: Sequence[Mapping[str, Any]],
    sort_by: str,
    device: str,
    torch_version: str,
    row_limit: int | None = None,
) -> str:
    """The op table stepscope writes to ``{worker}.profiler_out.txt`` for ``events``, each
    torch's ``KinetoEvent`` as a dict of its values under its methods' names (``name``,
    ``start_thread_id``, ``end_thread_id``, ``start_ns``, ``duration_ns``, ``correlation_id``,
    ``linked_correlation_id``, ``is_async``, ``is_hidden_event``, ``is_user_annotation``,
    ``is_python_function``) and ``on_device`` and ``overhead`` (its ``activity_type``), sorted
    by torch's ``sort_by`` key, as ``torch_version``'s ``key_averages()`` counts them; for
    holding it against torch's ``key_averages().table()``."""
def _add_kineto_glue_dir(dir: str) -> None: ...
def kineto_glue() -> dict[str, Any]:
    """The Kineto glue this process uses, loading it if needed: ``{"path", "built_for",
    "has_trace_only", "writes_python_parents"}`` (whether that torch has ``trace_only``, which
    stepscope asks for where nothing reads torch's event list; whether stepscope's serializer
    writes the Python parents it leaves out, so that captures with Python stacks take it too);
    raises ``BackendError`` when none matches the torch loaded."""
