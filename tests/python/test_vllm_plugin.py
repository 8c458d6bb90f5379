"""The vLLM plugin against the real vllm package (imported on CPU): vLLM's own plugin loader,
ProfilerConfig, Worker.profile, Worker.annotate_profile and SchedulerOutput."""

from __future__ import annotations

import gzip
import inspect
import json
import os
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="the vLLM plugin tests need vllm==0.32.0 in the venv")

import stepscope  # noqa: E402
import stepscope.vllm as plugin  # noqa: E402


@pytest.fixture(scope="module")
def vllm_loaded():
    """vLLM's plugin loader, as every vLLM process runs it; then the worker module."""
    import vllm.plugins

    vllm.plugins.load_general_plugins()
    import vllm.v1.worker.gpu_worker as gpu_worker

    return gpu_worker


def scheduler_output():
    """One mixed iteration: a new request (5 prompt tokens), a request still in chunked
    prefill (4 tokens, 8 computed, no output yet) and a decoding one (1 token, 9 computed)."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    new = NewRequestData(
        req_id="a",
        prompt_token_ids=[1] * 5,
        mm_features=[],
        sampling_params=None,
        pooling_params=None,
        block_ids=([0],),
        num_computed_tokens=0,
        lora_request=None,
    )
    cached = CachedRequestData(
        req_ids=["c", "b"],
        resumed_req_ids=set(),
        new_token_ids=[],
        all_token_ids={},
        new_block_ids=[None, None],
        num_computed_tokens=[8, 9],
        num_output_tokens=[0, 2],
    )
    scheduled = {"a": 5, "c": 4, "b": 1}
    return SchedulerOutput(
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
    )


SIMPLE = "execute_context_2(9)_generation_1(1)"
DETAILED = "execute_10_context_2(sq9sk17sqsq41sqsk73)_generation_1(sq1sk10sqsq1sqsk10)"


def test_each_requests_phase_is_vllms_own_in_mixed_and_single_phase_steps(vllm_loaded):
    from vllm.v1.utils import compute_iteration_details

    mixed = scheduler_output()
    r = plugin.scheduled.requests_of(mixed)
    assert (r.ids, r.tokens, r.outputs) == (["a", "c", "b"], [5, 4, 1], [0, 0, 2])
    assert r.computed == [0, 8, 9]
    # The core decides each phase from the outputs: vLLM's own test, request by request (new,
    # or a cached one still in its context phase), and vLLM's own counts.
    it = plugin.iteration_of(mixed, compute_iteration_details, shares=True, ids=True)
    cached = mixed.scheduled_cached_reqs
    assert it.request_prefill == [i == "a" or cached.is_context_phase(i) for i in r.ids]
    d = compute_iteration_details(mixed)
    assert sum(it.request_prefill) == d.num_ctx_requests
    for keep in (["b"], ["a", "c"]):
        one = scheduler_output()
        one.num_scheduled_tokens = {k: v for k, v in one.num_scheduled_tokens.items() if k in keep}
        if "a" not in keep:
            one.scheduled_new_reqs = []
        it = plugin.iteration_of(one, compute_iteration_details, shares=True)
        assert it.request_prefill == [k != "b" for k in keep], keep


def bare_worker(gpu_worker, profiler_config, rank=3):
    """A Worker carrying just the attributes profile() and annotate_profile() read."""
    worker = gpu_worker.Worker.__new__(gpu_worker.Worker)
    worker.profiler_config = profiler_config
    worker.vllm_config = SimpleNamespace(profiler_config=profiler_config)
    worker.rank = rank
    worker.local_rank = 0
    worker.profiler = None
    return worker


def annotations(trace: Path) -> list[str]:
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["name"] for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"]


@pytest.mark.parametrize("kind", ["torch", "cuda"])
def test_create_worker_profiler_returns_stepscopes(vllm_loaded, tmp_path, kind):
    from vllm.config import ProfilerConfig
    from vllm.profiler import wrapper

    dirs = {"torch_profiler_dir": str(tmp_path)} if kind == "torch" else {}
    cfg = ProfilerConfig(profiler=kind, delay_iterations=2, **dirs)
    for factory in (wrapper.create_worker_profiler, vllm_loaded.create_worker_profiler):
        p = factory(cfg, worker_name="dp0_rank0", local_rank=0)
        assert isinstance(p, stepscope.WorkerProfiler)
        assert p.worker_name == "dp0_rank0"
        assert json.loads(p.config_json)["delay_iterations"] == 2


def test_worker_profile_names_traces_with_vllms_rank_suffix(vllm_loaded, tmp_path):
    from vllm.config import ProfilerConfig

    cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path))
    worker = bare_worker(vllm_loaded, cfg, rank=3)
    worker.profile(True, "bench")
    assert isinstance(worker.profiler, stepscope.WorkerProfiler)
    for _ in range(2):
        with worker.annotate_profile(scheduler_output()):
            torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    worker.profile(False)
    assert not worker.profiler.is_active
    assert worker.profiler.flush(120)
    # No parallel state on this machine: vLLM's suffix is then rank{global rank}.
    (trace,) = tmp_path.glob("bench_rank3.*.pt.trace.json.gz")
    assert annotations(trace) == [SIMPLE, SIMPLE]
    (manifest,) = tmp_path.glob("bench_rank3.*.stepscope.json")
    assert json.loads(manifest.read_text())["iterations"] == 2

    # The second start reuses the profiler under the new prefix.
    worker.profile(True, "again")
    with worker.annotate_profile(scheduler_output()):
        pass
    worker.profile(False)
    assert worker.profiler.flush(120)
    assert len(list(tmp_path.glob("again_rank3.*.pt.trace.json.gz"))) == 1
    with pytest.raises(ValueError, match="delay_iterations"):
        worker.profile(True, delay_iterations=-1)


@pytest.mark.parametrize("detailed", [False, True])
def test_annotate_profile_gives_vllms_name_and_counts(vllm_loaded, tmp_path, detailed):
    from vllm.config import ProfilerConfig
    from vllm.v1.core.sched.output import SchedulerOutput

    cfg = ProfilerConfig(
        profiler="torch",
        torch_profiler_dir=str(tmp_path),
        detailed_trace_annotation=detailed,
        max_iterations=2,
    )
    # A step with requests, then one that scheduled nothing (vLLM runs such steps: its
    # detailed name for it has zero sums, not the simple form).
    schedules = [scheduler_output(), SchedulerOutput.make_empty()]
    worker = bare_worker(vllm_loaded, cfg)
    worker.profile(True)
    for schedule in schedules:
        with worker.annotate_profile(schedule):
            pass
    with worker.annotate_profile(scheduler_output()):  # > max: stops by itself
        pass
    assert worker.profiler.flush(120)
    (trace,) = tmp_path.glob("rank3.*.pt.trace.json.gz")
    expected = DETAILED if detailed else SIMPLE
    assert annotations(trace)[0] == expected

    # vLLM's own annotate_profile names the same iterations the same way.
    original = vllm_loaded.Worker.annotate_profile.__stepscope_original__
    seen = []

    class Oracle:
        should_annotate = True

        def step(self):
            pass

        def annotate_context_manager(self, name):
            seen.append(name)
            return torch.profiler.record_function(name)

    oracle_worker = bare_worker(vllm_loaded, cfg)
    oracle_worker.profiler = Oracle()
    for schedule in schedules:
        with original(oracle_worker, schedule):
            pass
    assert annotations(trace) == seen


def test_idle_iterations_compute_no_counts(vllm_loaded, tmp_path):
    from vllm.config import ProfilerConfig

    cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path))
    worker = bare_worker(vllm_loaded, cfg)
    worker.profile(True)
    worker.profile(False)

    class Exploding:
        def __getattr__(self, name):
            raise AssertionError(f"read {name} of an iteration nobody captures")

    with worker.annotate_profile(Exploding()):
        pass
    assert worker.profiler.step_index == 1


def test_the_plugin_is_idempotent(vllm_loaded):
    from vllm.profiler import wrapper

    before = (wrapper.create_worker_profiler, vllm_loaded.Worker.annotate_profile)
    plugin.register()
    plugin.factory._patch_wrapper(wrapper)
    plugin.worker._patch_gpu_worker(vllm_loaded)
    assert (wrapper.create_worker_profiler, vllm_loaded.Worker.annotate_profile) == before
    original = wrapper.create_worker_profiler.__stepscope_original__
    assert not hasattr(original, "__stepscope_original__")


def test_stepscope_config_keys_reach_the_profiler(vllm_loaded, tmp_path, monkeypatch):
    from vllm.config import ProfilerConfig

    monkeypatch.setenv("STEPSCOPE_CONFIG", '{"stepscope": {"nvtx": "always", "flush_timeout_s": 5}}')
    monkeypatch.setattr(plugin.environment, "_stepscope_keys", None)
    cfg = ProfilerConfig(profiler="cuda")
    p = vllm_loaded.create_worker_profiler(cfg, worker_name="w", local_rank=0)
    keys = json.loads(p.config_json)["stepscope"]
    assert (keys["nvtx"], keys["flush_timeout_s"]) == ("always", 5.0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"stepscope": [1]}', '"stepscope" must be a JSON object'),
        ('{"max_iterations": 3}', "max_iterations"),
        ("{not json", "invalid JSON"),
        ("/nonexistent/stepscope.json", "/nonexistent/stepscope.json"),
    ],
)
def test_a_bad_stepscope_config_is_an_error_naming_the_field(monkeypatch, value, message):
    monkeypatch.setenv("STEPSCOPE_CONFIG", value)
    with pytest.raises(stepscope.ConfigError, match=message.replace(".", r"\.")):
        plugin.stepscope_keys_from_env()


def test_stepscope_keys_are_validated_with_vllms_fields(vllm_loaded, monkeypatch):
    """`repeat` needs vLLM's max_iterations: alone it would be refused, merged it is valid."""
    from vllm.config import ProfilerConfig

    monkeypatch.setenv("STEPSCOPE_CONFIG", '{"stepscope": {"repeat": 2, "repeat_every": 12}}')
    monkeypatch.setattr(plugin.environment, "_stepscope_keys", None)
    cfg = ProfilerConfig(profiler="cuda", max_iterations=3)
    p = vllm_loaded.create_worker_profiler(cfg, worker_name="w", local_rank=0)
    assert isinstance(p, stepscope.WorkerProfiler)
    assert (p.status()["windows"], p.status()["max_iterations"]) == (2, 3)
    # Without max_iterations the merged config is refused for that key alone, named in the log;
    # the profiler is still stepscope's, with the other keys.
    cfg = ProfilerConfig(profiler="cuda")
    with _captured_log() as records:
        p = vllm_loaded.create_worker_profiler(cfg, worker_name="w", local_rank=0)
    assert isinstance(p, stepscope.WorkerProfiler)
    assert p.status()["windows"] == 1
    assert any("stepscope.repeat" in r.getMessage() and r.levelname == "ERROR" for r in records)


def test_one_bad_stepscope_key_is_left_out_and_the_others_apply(vllm_loaded, monkeypatch):
    from vllm.config import ProfilerConfig

    monkeypatch.setenv("STEPSCOPE_CONFIG", '{"stepscope": {"nvtx": "loud", "flush_timeout_s": 5}}')
    monkeypatch.setattr(plugin.environment, "_stepscope_keys", None)
    with _captured_log() as records:
        p = vllm_loaded.create_worker_profiler(
            ProfilerConfig(profiler="cuda"), worker_name="w", local_rank=0
        )
    keys = json.loads(p.config_json)["stepscope"]
    assert (keys["nvtx"], keys["flush_timeout_s"]) == ("running", 5.0)
    messages = [r.getMessage() for r in records if r.levelname == "ERROR"]
    assert any("stepscope.nvtx" in m and "left out" in m for m in messages), messages


def next_vllms_profiler_config():
    """vLLM's real ProfilerConfig with one field more, as a newer vLLM would have it: a
    pydantic dataclass subclass (vLLM's own kind of config class)."""
    from pydantic.dataclasses import dataclass as pydantic_dataclass
    from vllm.config import ProfilerConfig

    @pydantic_dataclass
    class NextProfilerConfig(ProfilerConfig):
        torch_profiler_with_modules: bool = False

    return NextProfilerConfig


def test_a_field_of_a_newer_vllm_at_its_default_is_left_out_with_one_info_line(
    vllm_loaded, tmp_path
):
    import logging

    # The API server's profiler too.
    front_cfg = next_vllms_profiler_config()(profiler="torch", torch_profiler_dir=str(tmp_path))
    front = plugin.FrontendProfiler(front_cfg, "api")
    assert isinstance(front.profiler, stepscope.WorkerProfiler)
    front.shutdown()
    cfg = next_vllms_profiler_config()(profiler="cuda", max_iterations=2)
    plugin.environment._informed.discard("field:torch_profiler_with_modules")
    with _captured_log() as records:
        p = vllm_loaded.create_worker_profiler(cfg, worker_name="w", local_rank=0)
        vllm_loaded.create_worker_profiler(cfg, worker_name="w", local_rank=0)
    assert isinstance(p, stepscope.WorkerProfiler)
    assert json.loads(p.config_json)["max_iterations"] == 2
    named = [r for r in records if "torch_profiler_with_modules" in r.getMessage()]
    assert [r.levelno for r in named] == [logging.INFO], [r.getMessage() for r in records]
    assert "left out" in named[0].getMessage()


def test_a_field_of_a_newer_vllm_set_keeps_vllms_own_profiler_with_one_warning(vllm_loaded):
    import logging

    cfg = next_vllms_profiler_config()(profiler="cuda", torch_profiler_with_modules=True)
    plugin.environment._warned.discard("field:torch_profiler_with_modules")
    with _captured_log() as records:
        p = vllm_loaded.create_worker_profiler(cfg, worker_name="w", local_rank=0)
        vllm_loaded.create_worker_profiler(cfg, worker_name="w", local_rank=0)
    assert not isinstance(p, stepscope.WorkerProfiler), "a set field stepscope cannot honour"
    named = [r for r in records if "torch_profiler_with_modules" in r.getMessage()]
    assert [r.levelno for r in named] == [logging.WARNING], [r.getMessage() for r in records]
    assert "True" in named[0].getMessage() and "vLLM's own profiler" in named[0].getMessage()


def test_profilers_stepscope_does_not_drive_stay_vllms(vllm_loaded, tmp_path):
    from vllm.config import ProfilerConfig

    fields = {f.name for f in __import__("dataclasses").fields(ProfilerConfig)}
    if "proton_profiler_dir" not in fields:
        pytest.skip("this vLLM has no Proton profiler")
    cfg = ProfilerConfig(profiler="proton", proton_profiler_dir=str(tmp_path))
    try:
        p = vllm_loaded.create_worker_profiler(cfg, worker_name="w", local_rank=0)
    except Exception as e:  # noqa: BLE001 - vLLM's own Proton wrapper needs triton's proton
        assert "stepscope" not in repr(e), e
        return
    assert not isinstance(p, stepscope.WorkerProfiler)


class _captured_log:
    """Records of the ``stepscope.vllm`` logger inside a ``with`` block."""

    def __enter__(self) -> list:
        import logging

        self.records: list = []
        self.handler = logging.Handler()
        self.handler.emit = self.records.append  # type: ignore[method-assign]
        self.logger = logging.getLogger("stepscope.vllm")
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.handler)
        return self.records

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


CHILD = """
import logging, os, sys, tempfile
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
{before}
import vllm.plugins
vllm.plugins.load_general_plugins()
from vllm.config import ProfilerConfig
from vllm.profiler import wrapper
print("PATCHED", hasattr(wrapper.create_worker_profiler, "__stepscope_original__"))
{after}
"""


@pytest.fixture
def child(fresh_python):
    """`child(code, env)`: `python -c code` in a fresh process (torch imported, not vLLM: see
    forked.py) with this environment less STEPSCOPE_* plus `env`; asserts it exits 0."""

    def run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
        child_env.update(env)
        proc = fresh_python.run(code=textwrap.dedent(code), env=child_env)
        assert proc.returncode == 0, proc.stderr
        return proc

    return run


@pytest.mark.parametrize(
    ("env", "log"),
    [
        ({"STEPSCOPE_VLLM": "0"}, "STEPSCOPE_VLLM=0"),
        ({"STEPSCOPE_CONFIG": "{not json"}, "invalid JSON"),
    ],
)
def test_switched_off_or_misconfigured_the_plugin_leaves_vllms_profiler(child, env, log):
    proc = child(CHILD.format(before="", after=""), env)
    assert "PATCHED False" in proc.stdout
    assert log in proc.stderr


def test_a_bad_stepscope_key_does_not_drop_the_plugin(child):
    after = """
p = wrapper.create_worker_profiler(ProfilerConfig(profiler="cuda"), worker_name="w", local_rank=0)
print("TYPE", type(p).__module__)
"""
    env = {"STEPSCOPE_CONFIG": '{"stepscope": {"nvtx": "loud"}}'}
    proc = child(CHILD.format(before="", after=after), env)
    assert "PATCHED True" in proc.stdout
    assert "TYPE stepscope" in proc.stdout
    assert "stepscope.nvtx" in proc.stderr


def test_a_worker_module_imported_before_the_plugin_is_patched_too(child):
    after = """
import stepscope, stepscope.vllm as plugin
from vllm.v1.worker import gpu_worker
print("WORKER", gpu_worker.create_worker_profiler is wrapper.create_worker_profiler,
      hasattr(gpu_worker.Worker.annotate_profile, "__stepscope_original__"))
"""
    proc = child(CHILD.format(before="import vllm.v1.worker.gpu_worker", after=after), {})
    assert "PATCHED True" in proc.stdout
    assert "WORKER True True" in proc.stdout


def test_the_global_rank_comes_from_vllms_worker_name(vllm_loaded, tmp_path):
    from vllm.config import ProfilerConfig

    assert plugin.rank_of("bench_dp0_pp0_tp1_dcp0_ep0_rank5") == 5
    assert plugin.rank_of("worker") is None
    cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path))
    worker = bare_worker(vllm_loaded, cfg, rank=5)
    assert worker.stepscope_status()["phase"] == "not_created"
    worker.profile(True)
    status = worker.stepscope_status()
    assert (status["rank"], status["phase"], status["worker_name"]) == (5, "running", "rank5")
    worker.profile(False)


def test_the_status_endpoint_answers_for_every_engine_worker(vllm_loaded, tmp_path, monkeypatch):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.config import ProfilerConfig

    workers = []
    for rank in range(2):
        cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path), delay_iterations=3)
        workers.append(bare_worker(vllm_loaded, cfg, rank=rank))
    workers[1].profile(True)

    class Engine:
        """vLLM's engine client as the endpoint sees it: collective_rpc by method name,
        answered here by the worker objects themselves."""

        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            return [getattr(w, method)(*args, **(kwargs or {})) for w in workers]

    # vLLM's own loader finds the endpoint only when VLLM_PLUGINS names it.
    from vllm.plugins import load_endpoint_plugins

    monkeypatch.setenv("VLLM_PLUGINS", "stepscope")
    (endpoint,) = [p for p in load_endpoint_plugins() if p.name == "stepscope"]
    app = FastAPI()
    endpoint.attach_router(app)
    client = TestClient(app)
    assert client.get("/stepscope/status").status_code == 503  # no engine yet
    import asyncio

    asyncio.run(endpoint.init_state(Engine(), app.state, None))
    body = client.get("/stepscope/status").json()
    phases = [(w["rank"], w["phase"]) for w in body["workers"]]
    assert phases == [(0, "not_created"), (1, "delaying")]
    assert body["workers"][1]["delay_iterations"] == 3


def takes_profiler_kwargs(gpu_worker) -> bool:
    """vLLM 0.33's Worker.profile passes /start_profile's profiler_kwargs; 0.32's has none."""
    import inspect

    return "profiler_kwargs" in inspect.signature(gpu_worker.Worker.profile).parameters


def test_profiler_kwargs_apply_per_start_and_none_restores_the_config(vllm_loaded, tmp_path):
    """vLLM 0.33: the factory takes profiler_kwargs, and every start calls
    set_profiler_kwargs (None without them). Keys Kineto's C++ API lacks are logged, never
    raised into the engine."""
    if not takes_profiler_kwargs(vllm_loaded):
        pytest.skip(f"vLLM {vllm.__version__}'s Worker.profile has no profiler_kwargs")
    from vllm.config import ProfilerConfig

    cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path))
    worker = bare_worker(vllm_loaded, cfg, rank=0)
    kwargs = {"record_shapes": True, "acc_events": True, "with_modules": False}
    with _captured_log() as records:
        worker.profile(True, "kw", profiler_kwargs=kwargs)
    assert not [r for r in records if r.levelname == "ERROR"]
    assert isinstance(worker.profiler, stepscope.WorkerProfiler)
    assert worker.profiler.config["torch_profiler_record_shapes"] is True
    with worker.annotate_profile(scheduler_output()):
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    worker.profile(False)
    worker.profile(True, "plain")  # no profiler_kwargs: vLLM passes None, the config returns
    assert worker.profiler.config["torch_profiler_record_shapes"] is False
    with worker.annotate_profile(scheduler_output()):
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    worker.profile(False)
    assert worker.profiler.flush(120)

    def shapes(prefix: str) -> list[bool]:
        (trace,) = tmp_path.glob(f"{prefix}_rank0.*.pt.trace.json.gz")
        with gzip.open(trace, "rt") as f:
            events = json.load(f)["traceEvents"]
        return [
            "Input Dims" in e.get("args", {})
            for e in events
            if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"
        ]

    assert shapes("kw") and all(shapes("kw"))
    assert shapes("plain") and not any(shapes("plain"))


def test_a_factory_with_an_unknown_signature_is_left_to_vllm(child):
    """A vLLM whose create_worker_profiler takes something this plugin does not know: one
    warning naming it, and vLLM's own profiler."""
    before = """
import vllm.profiler.wrapper as w
_orig = w.create_worker_profiler
def create_worker_profiler(profiler_config, *, worker_name, local_rank, profiler_kwargs=None,
                           new_knob=None):
    return _orig(profiler_config, worker_name=worker_name, local_rank=local_rank)
w.create_worker_profiler = create_worker_profiler
"""
    after = """
p = wrapper.create_worker_profiler(ProfilerConfig(profiler="cuda"), worker_name="w", local_rank=0)
print("TYPE", type(p).__module__)
"""
    proc = child(CHILD.format(before=before, after=after), {})
    assert "PATCHED False" in proc.stdout
    assert "TYPE vllm" in proc.stdout
    assert "new_knob" in proc.stderr and "not a signature this stepscope knows" in proc.stderr
    assert proc.stderr.count("not a signature this stepscope knows") == 1


def test_without_glue_for_this_torch_vllm_keeps_torch_and_stepscope_keeps_cuda(child, tmp_path):
    """No Kineto glue for the torch in the process: "torch" is vLLM's own profiler (one
    warning naming the torch found), "cuda" is still stepscope's."""
    after = f"""
import torch
for kind in ("torch", "torch", "cuda"):
    dirs = {{"torch_profiler_dir": {str(tmp_path)!r}}} if kind == "torch" else {{}}
    cfg = ProfilerConfig(profiler=kind, **dirs)
    p = wrapper.create_worker_profiler(cfg, worker_name="w", local_rank=0)
    print("TYPE", kind, type(p).__module__)
"""
    env = {"STEPSCOPE_KINETO_GLUE_DIR": str(tmp_path)}  # replaces the package's: none there
    proc = child(CHILD.format(before="", after=after), env)
    assert "PATCHED True" in proc.stdout
    assert proc.stdout.count("TYPE torch vllm") == 2
    assert "TYPE cuda stepscope" in proc.stdout
    version = torch.__version__.split("+")[0]
    assert proc.stderr.count(f"no Kineto glue for torch {torch.__version__}") == 1, proc.stderr
    assert version in proc.stderr


def test_check_reports_the_versions_the_patches_and_the_backends(fresh_python, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    run = lambda extra: fresh_python.run(  # noqa: E731
        module="stepscope.vllm", args=["--check"], env={**env, **extra}
    )
    proc = run({})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"vllm                         {vllm.__version__}" in out
    assert f"torch                        {torch.__version__}" in out
    for label in ("create_worker_profiler", "Worker.annotate_profile", "shutdown wait"):
        assert f"{label:<28} patched" in out, out
    minor = ".".join(torch.__version__.split(".")[:2])
    assert f"libstepscope_kineto-torch{minor}.so" in out
    assert "the plugin takes over vLLM's profiler here" in out
    # No glue for this torch: torch stays vLLM's, the plugin still takes over (cuda).
    proc = run({"STEPSCOPE_KINETO_GLUE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vLLM's own:" in proc.stdout
    assert f"no Kineto glue for torch {torch.__version__}" in proc.stdout


@pytest.mark.parametrize("record_shapes", [False, True])
def test_captured_iterations_name_the_scheduler_outputs_requests(
    vllm_loaded, tmp_path, monkeypatch, record_shapes
):
    from vllm.config import ProfilerConfig

    monkeypatch.setenv("STEPSCOPE_CONFIG", '{"stepscope": {"request_ids": true}}')
    monkeypatch.setattr(plugin.environment, "_stepscope_keys", None)
    cfg = ProfilerConfig(
        profiler="torch",
        torch_profiler_dir=str(tmp_path),
        torch_profiler_record_shapes=record_shapes,
        max_iterations=1,
    )
    worker = bare_worker(vllm_loaded, cfg)
    worker.profile(True)
    assert worker.profiler.wants_request_ids
    for _ in range(2):  # the second is past max: the session stops by itself
        with worker.annotate_profile(scheduler_output()):
            pass
    assert worker.profiler.flush(120)
    (manifest,) = tmp_path.glob("rank3.*.stepscope.json")
    m = json.loads(manifest.read_text())
    # Each request with its tokens and phase as vLLM counts them (SIMPLE: its own counts),
    # and the step's work: the sums of vLLM's own detailed name of it (DETAILED), recorded
    # though detailed_trace_annotation is off.
    work = {
        "context": {"requests": 2, "sq": 9, "sk": 17, "sqsq": 41, "sqsk": 73},
        "generation": {"requests": 1, "sq": 1, "sk": 10, "sqsq": 1, "sqsk": 10},
    }
    assert DETAILED == "execute_10_context_2(sq9sk17sqsq41sqsk73)_generation_1(sq1sk10sqsq1sqsk10)"
    assert m["steps"] == [
        {"step": 1, "requests": ["a", "c", "b"], "tokens": [5, 4, 1],
         "prefill": [True, True, False], "work": work}
    ]  # fmt: skip
    (trace,) = tmp_path.glob("rank3.*.pt.trace.json.gz")
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    assert doc["stepscope"]["steps"] == m["steps"]
    (args,) = [e["args"] for e in doc["traceEvents"] if e.get("name") == SIMPLE]
    # The annotation's own args: Kineto's kwinputs with shapes recorded, else written in by
    # stepscope's writer as the trace streams to disk; its record id is its step.
    assert (args["Record function id"], args["requests"]) == (1, ["a", "c", "b"])
    assert list(args).count("requests") == 1


def test_the_api_servers_profile_left_running_is_written_at_exit_not_crashed(
    fresh_python, tmp_path
):
    """A /start_profile nobody stopped: the API server's process exits with its CPU profile on.
    torch's profiler state destroyed at exit with the session on segfaulted the process; the
    session is stopped and its trace written first."""
    code = textwrap.dedent(
        """
        import sys, torch
        from vllm.config import ProfilerConfig
        import stepscope.vllm as plugin
        cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=sys.argv[1])
        p = plugin.FrontendProfiler(cfg, "api")
        p.start()
        for _ in range(3):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_")}
    r = fresh_python.run(code=code, args=[str(tmp_path)], env=env, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    (manifest,) = tmp_path.glob("*.stepscope.json")
    assert json.loads(manifest.read_text())["status"] == "complete"


def test_the_timeline_times_every_step_from_the_first_and_serves_profile(
    vllm_loaded, tmp_path, monkeypatch
):
    """With ``"stepscope": {"timeline": ...}`` the worker's profiler is made at its first
    step, not its first /start_profile: every step is in the timeline with vLLM's counts, and
    Worker.profile() then captures with that same profiler."""
    from vllm.config import ProfilerConfig

    monkeypatch.setattr(plugin.environment, "_stepscope_keys", {"timeline": {"steps": 64}})
    cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path))
    worker = bare_worker(vllm_loaded, cfg, rank=3)
    for _ in range(3):
        with worker.annotate_profile(scheduler_output()):
            pass
    profiler = worker.profiler
    assert isinstance(profiler, stepscope.WorkerProfiler) and profiler.has_timeline
    worker.profile(True, "tl")
    assert worker.profiler is profiler
    with worker.annotate_profile(scheduler_output()):
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    worker.profile(False)
    assert profiler.flush(120)
    (trace,) = tmp_path.glob("tl_rank3.*.pt.trace.json.gz")
    assert annotations(trace) == [SIMPLE]

    got = plugin.worker_timeline(worker)
    assert got["fields"] == list(stepscope.TIMELINE_FIELDS)
    steps = [dict(zip(got["fields"], s, strict=True)) for s in got["steps"]]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    # vLLM's counts of the iteration (SIMPLE): 2 context requests (9 tokens), 1 decoding.
    assert {(s["num_ctx_reqs"], s["num_ctx_tokens"], s["num_gen_reqs"], s["num_gen_tokens"])
            for s in steps} == {(2, 9, 1, 1)}
    assert [s["phase"] for s in steps] == ["idle", "idle", "idle", "running"]
    assert [s[0] for s in plugin.worker_timeline(worker, since=3)["steps"]] == [4]


def test_without_the_timeline_the_profiler_waits_for_start_profile(vllm_loaded, tmp_path):
    from vllm.config import ProfilerConfig

    cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path))
    worker = bare_worker(vllm_loaded, cfg)
    with worker.annotate_profile(scheduler_output()):
        pass
    assert worker.profiler is None
    assert plugin.worker_timeline(worker)["steps"] is None


class EngineCore:
    """vLLM's engine-core client as AsyncLLM and LLMEngine use it for profiling, answered by
    real worker objects (each with its stepscope profiler and real Kineto): ``profile`` reaches
    every worker as vLLM's executor does, and a worker's exception comes back as vLLM's
    utility call reports it (an Exception with the text)."""

    def __init__(self, workers):
        self.workers = workers
        self.rpcs: list[str] = []

    def shutdown(self, *args, **kwargs):
        pass

    def profile(self, is_start=True, *args, **kwargs):
        try:
            for w in self.workers:
                w.profile(is_start)
        except Exception as e:  # noqa: BLE001 - as vLLM's utility call passes it on
            raise Exception(f"Call to profile method failed: {e}") from None  # noqa: TRY002

    async def profile_async(self, is_start=True, *args, **kwargs):
        # vLLM 0.33 passes profiler_kwargs too: the workers' start here takes the config's.
        self.profile(is_start)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpcs.append(method)
        return [getattr(w, method)(*args, **(kwargs or {})) for w in self.workers]


def engines(gpu_worker, tmp_path, stepscope_keys=None, monkeypatch=None):
    """vLLM's AsyncLLM and LLMEngine (their real profiling methods, as the plugin patched
    them) around a worker whose traces go to ``tmp_path`` (one: Kineto records one session per
    thread, and these workers share the test's)."""
    import asyncio

    from vllm.config import ProfilerConfig
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.llm_engine import LLMEngine

    if stepscope_keys is not None:
        monkeypatch.setenv("STEPSCOPE_CONFIG", json.dumps({"stepscope": stepscope_keys}))
        monkeypatch.setattr(plugin.environment, "_stepscope_keys", None)
    cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path))
    core = EngineCore([bare_worker(gpu_worker, cfg, rank=0)])
    async_llm = AsyncLLM.__new__(AsyncLLM)
    async_llm.engine_core = core
    async_llm.profiler = None
    async_llm._profile_lock = asyncio.Lock()
    async_llm._profile_session_guard_enabled = True
    async_llm._profile_session_active = False
    async_llm._frontend_profiler_injected = True

    async def collective_rpc(method, timeout=None, args=(), kwargs=None):
        return core.collective_rpc(method, timeout, args, kwargs)

    async_llm.collective_rpc = collective_rpc
    llm_engine = LLMEngine.__new__(LLMEngine)
    llm_engine.engine_core = core
    llm_engine._profile_session_active = False
    llm_engine.collective_rpc = core.collective_rpc
    return async_llm, llm_engine, core


def step(core, n=2):
    for w in core.workers:
        for _ in range(n):
            w.profiler.step()


def test_the_plugin_patches_the_stop_the_start_and_the_profile_routes(vllm_loaded):
    from vllm.entrypoints.serve.profile import api_router
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.llm_engine import LLMEngine

    from stepscope.vllm.interfaces import PATCHED_MARK

    for fn in (AsyncLLM.stop_profile, AsyncLLM.start_profile, LLMEngine.stop_profile,
               LLMEngine.start_profile, api_router.attach_router):  # fmt: skip
        assert hasattr(fn, PATCHED_MARK), fn


def test_a_stop_returns_with_every_workers_trace_complete_on_disk(vllm_loaded, tmp_path):
    import asyncio

    async_llm, llm_engine, core = engines(vllm_loaded, tmp_path)
    for engine, run in ((async_llm, asyncio.run), (llm_engine, lambda x: x)):
        core.rpcs.clear()
        run(engine.start_profile())
        step(core)
        run(engine.stop_profile())
        # Acted on at once, as verl does: every trace of the stop is whole, its manifest
        # complete, nothing is being written, no temporary.
        writes = [w.profiler.writes_since(0) for w in core.workers]
        assert all(w["pending_writes"] == 0 for w in writes)
        names = os.listdir(tmp_path)
        assert not [n for n in names if n.startswith(".")], names
        for w in core.workers:
            (last,) = w.profiler.writes_since(w._stepscope_ticket)["traces"]
            assert last["status"] == "complete"
            assert stepscope.read_manifest(last["manifest_file"])["status"] == "complete"
            with gzip.open(last["trace_file"], "rt") as f:
                assert json.load(f)["traceEvents"]
        assert core.rpcs[0] == "stepscope_stop_ticket" and "stepscope_writes" in core.rpcs


def test_a_trace_that_cannot_be_written_makes_the_stop_an_error_naming_worker_and_file(
    vllm_loaded, tmp_path
):
    import asyncio

    traces = tmp_path / "traces"
    async_llm, _, core = engines(vllm_loaded, traces)
    asyncio.run(async_llm.start_profile())
    step(core)
    # The directory goes away under the capture: the write fails.
    import shutil

    shutil.rmtree(traces)
    traces.write_text("not a directory")
    with pytest.raises(stepscope.TraceNotWritten) as e:
        asyncio.run(async_llm.stop_profile())
    text = str(e.value)
    assert "rank0" in text and ".pt.trace.json.gz" in text, text
    assert {t["status"] for t in e.value.traces} == {"failed"}
    # The session is over all the same (vLLM's own state too): a new start is taken.
    assert not async_llm._profile_session_active


def test_with_stop_returns_at_once_the_stop_does_not_wait(vllm_loaded, tmp_path, monkeypatch):
    import asyncio

    async_llm, _, core = engines(vllm_loaded, tmp_path, {"stop_returns": "at_once"}, monkeypatch)
    asyncio.run(async_llm.start_profile())
    step(core)
    asyncio.run(async_llm.stop_profile())
    assert "stepscope_writes" not in core.rpcs, core.rpcs
    for w in core.workers:
        assert w.profiler.flush(60)


def test_a_start_refused_by_a_worker_raises_start_refused_naming_the_key(
    vllm_loaded, tmp_path, monkeypatch
):
    import asyncio

    keys = {"min_free_disk_mb": 1 << 40}
    async_llm, llm_engine, core = engines(vllm_loaded, tmp_path, keys, monkeypatch)
    for call in (lambda: asyncio.run(async_llm.start_profile()), llm_engine.start_profile):
        with pytest.raises(stepscope.StartRefused) as e:
            call()
        assert e.value.key == "stepscope.min_free_disk_mb"
        assert "MB free" in str(e.value) and "rank0" in str(e.value)
    # Nothing armed; AsyncLLM's own session guard was released.
    assert not async_llm._profile_session_active
    assert all(not w.profiler.is_active for w in core.workers)


def test_the_profile_routes_answer_a_refusal_with_503_and_an_unwritten_trace_with_500(
    vllm_loaded, tmp_path, monkeypatch
):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.entrypoints.serve.profile import api_router

    async def refuse(**kwargs):
        raise stepscope.StartRefused("start refused by `stepscope.min_free_disk_mb`: full")

    async def unwritten():
        raise stepscope.TraceNotWritten("rank0: /t/x.pt.trace.json.gz: disk full", [])

    from vllm.config import ProfilerConfig

    app = FastAPI()
    app.state.engine_client = SimpleNamespace(start_profile=refuse, stop_profile=unwritten)
    cfg = ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path))
    app.state.args = SimpleNamespace(profiler_config=cfg)
    # As vLLM's build_app attaches the profile routes (the plugin's patch adds the handlers).
    api_router.attach_router(app)
    client = TestClient(app, raise_server_exceptions=False)
    r = client.post("/start_profile")
    assert r.status_code == 503 and "min_free_disk_mb" in r.json()["error"], r.text
    r = client.post("/stop_profile")
    assert r.status_code == 500 and "disk full" in r.json()["error"], r.text


def test_the_routes_key_rule_is_vllms(monkeypatch):
    """``--api-key`` (one or several) over ``VLLM_API_KEY``; ``Bearer`` (any case) with one of
    them; a server without a key answers everyone."""
    from stepscope.vllm.endpoints import api_tokens, authorized

    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    tokens = api_tokens(SimpleNamespace(api_key=["k1", "k2"]))
    assert authorized(tokens, "Bearer k2") and authorized(tokens, "bearer k1")
    assert not authorized(tokens, "Bearer from-env")
    assert not authorized(tokens, None) and not authorized(tokens, "k1") and not authorized(tokens, "Basic k1")
    from_env = api_tokens(SimpleNamespace(api_key=None))
    assert authorized(from_env, "Bearer from-env") and not authorized(from_env, "Bearer k1")
    monkeypatch.delenv("VLLM_API_KEY")
    assert api_tokens(SimpleNamespace()) == [] and authorized([], None)



def test_the_request_log_patches_vllms_scheduler_only_when_asked(vllm_loaded, monkeypatch):
    from vllm.v1.core.sched import scheduler
    from vllm.v1.engine import FinishReason, core
    from vllm.v1.request import RequestStatus

    from stepscope.vllm import lifecycles

    mark = "__stepscope_original__"
    # Off (the default: this process registered the plugin without it), vLLM's scheduler is
    # untouched, and the engine core answers that it keeps no log.
    assert not hasattr(scheduler.Scheduler.schedule, mark)
    assert json.loads(core.EngineCore.stepscope_requests(None, 0))["requests"] is None
    # The hooks wrap the four methods, each keeping vLLM's, once; undone after.
    names = ("add_request", "schedule", "update_from_output", "finish_requests")
    originals = {n: getattr(scheduler.Scheduler, n) for n in names}
    try:
        lifecycles._patch_scheduler(scheduler)
        lifecycles._patch_scheduler(scheduler)
        for n in names:
            assert getattr(getattr(scheduler.Scheduler, n), mark) is originals[n], n
    finally:
        for n, f in originals.items():
            setattr(scheduler.Scheduler, n, f)
    # On, the engine core answers with its log, sized as the config says.
    monkeypatch.setenv("STEPSCOPE_CONFIG", json.dumps({"stepscope": {"requests": {"requests": 32}}}))
    monkeypatch.setattr(lifecycles, "_tried", False)
    monkeypatch.setattr(lifecycles, "_log", None)
    monkeypatch.setattr(plugin.environment, "_stepscope_keys", None)
    answer = json.loads(core.EngineCore.stepscope_requests(None, 0))
    assert answer["capacity"] == {"requests": 32, "steps": 4096}, answer
    # A schedule that scheduled nothing (vLLM's loop polls while it waits) keeps no step;
    # one that did is recorded and named on its output.
    from vllm.v1.core.sched.output import SchedulerOutput

    log = stepscope.RequestLog(requests=16, steps=16)
    empty = SchedulerOutput.make_empty()
    lifecycles._record_schedule(log, log.begin_step(), empty)
    assert json.loads(log.document_json())["step_index"] == 0
    assert not hasattr(empty, lifecycles.STEP_ATTR)
    busy = scheduler_output()
    lifecycles._record_schedule(log, log.begin_step(), busy)
    assert getattr(busy, lifecycles.STEP_ATTR) == 1
    assert len(json.loads(log.document_json())["requests"]) == len(busy.num_scheduled_tokens)
    # EngineCore.profile: wrapped once, with vLLM's signature (its utility calls read it), and
    # the log's step index as a window's start.
    original = core.EngineCore.profile
    try:
        lifecycles._patch_profile(core.EngineCore)
        lifecycles._patch_profile(core.EngineCore)
        assert getattr(core.EngineCore.profile, mark) is original
        assert inspect.signature(core.EngineCore.profile) == inspect.signature(original)
    finally:
        core.EngineCore.profile = original
    assert log.step_index == 1
    # vLLM's reasons, as the log names them.
    reasons = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT,
               RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_LENGTH_CAPPED)  # fmt: skip
    named = stepscope.RequestLog(16, 16)
    for i, r in enumerate(reasons):
        named.arrived(f"r{i}", 1)
        named.finished(None, f"r{i}", lifecycles._finish_name(r))
    doc = json.loads(named.document_json(0))
    assert [x["finish"] for x in doc["requests"]] == ["stop", "length", "abort", "abort", "length"]
