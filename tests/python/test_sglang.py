"""The SGLang plugin on the real ``sglang`` package (0.5.23), imported on CPU: SGLang's own
``load_plugins`` finds the entry point and applies the hooks with its ``HookRegistry``; a real
``SchedulerProfilerManager`` gets real ``ProfileReq`` objects and one
``_profile_batch_predicate`` call per forward batch, as the scheduler's ``run_batch`` makes
them (after counting the batch); real Kineto records the CPU work between them.

Stand-ins, for what needs a GPU server: the forward batch (a namespace with SGLang's
``ForwardMode`` and the fields the plugin reads), SGLang's parallel state (its own
``get_parallel().override``), and the TP group (a one-process gloo group).

Runs in the ``.venv-sglang`` environment (``make test``); skipped where SGLang is not installed.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import stepscope  # noqa: E402
import stepscope.sglang as plugin  # noqa: E402

pm = importlib.import_module(plugin.MANAGER_MODULE)  # SGLang's scheduler-side modules: ~40 s
from sglang.srt.managers.io_struct import ProfileReq, ProfileReqType  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

P, D, M, I = ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.MIXED, ForwardMode.IDLE
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def scheduler_process():
    """A scheduler process as far as the plugin sees it: plugins loaded by SGLang, TP rank 0 of
    one, a gloo group for SGLang's own barriers."""
    os.environ["SGLANG_PLUGINS"] = "stepscope"
    from sglang.srt import plugins

    plugins.load_plugins()
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
        )
    group = SimpleNamespace(cpu_group=dist.group.WORLD)
    original = pm.get_dp_tp_group
    pm.get_dp_tp_group = lambda: group
    ranks = dict(tp_rank=0, tp_size=1, num_dp_ranks=1, dp_rank=0, pp_size=1, pp_rank=0,
                 moe_ep_size=1, moe_ep_rank=0)  # fmt: skip
    try:
        with get_parallel().override(**ranks):
            yield
    finally:
        pm.get_dp_tp_group = original
        dist.destroy_process_group()


@pytest.fixture(scope="module", autouse=True)
def sglang_process():
    with scheduler_process():
        yield


class Scheduler:
    """What SGLang's ``Scheduler.run_batch`` does around the profiler: count the batch, call
    the predicate, run the forward (here CPU matmuls, more for bigger batches)."""

    def __init__(self) -> None:
        self.forward_ct = 0
        self.manager = pm.SchedulerProfilerManager(get_forward_ct=lambda: self.forward_ct)
        self.x = torch.randn(64, 64)

    def profile(self, **fields):
        return self.manager._profile(ProfileReq(**fields))

    def stop(self):
        return self.manager._profile(ProfileReq(req_type=ProfileReqType.STOP_PROFILE))

    def run(self, mode, reqs=2, tokens=None, decoding=0):
        """One forward batch; a prefill's token count defaults to 100 + its forward count,
        so each captured batch can be told from the others by its annotation. Its requests'
        ``rid`` s are ``f"{forward count}.{i}"``."""
        self.forward_ct += 1
        tokens = 100 + self.forward_ct if tokens is None else tokens
        batch = SimpleNamespace(
            forward_mode=mode,
            reqs=[SimpleNamespace(rid=f"{self.forward_ct}.{i}") for i in range(reqs)],
            extend_num_tokens=tokens if mode.is_extend() else None,
            decoding_reqs=[object()] * decoding if decoding else None,
            batch_size=lambda: reqs,
        )
        self.manager._profile_batch_predicate(batch)
        for _ in range(reqs):
            self.x = torch.mm(self.x, self.x).tanh()


def profile_req(tmp_path: Path, profile_id: str, **fields) -> dict:
    base = dict(output_dir=str(tmp_path), activities=["CPU"], with_stack=False,
                profile_id=profile_id)  # fmt: skip
    return {**base, **fields}


def wait_complete(path: Path, timeout: float = 120.0) -> dict:
    """The manifest once the trace beside it is complete."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            m = json.loads(path.read_text())
            if m["status"] != "writing":
                assert m["status"] == "complete", m
                return m
        time.sleep(0.05)
    raise AssertionError(f"{path} not complete after {timeout} s")


def annotations(trace: Path) -> list[str]:
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"]
    return [e["name"] for e in sorted(spans, key=lambda e: e["ts"])]


def prefill(step: int, reqs: int = 2) -> str:
    return stepscope.Iteration(num_ctx_reqs=reqs, num_ctx_tokens=100 + step).name()


def decode(reqs: int = 2) -> str:
    return stepscope.Iteration(num_gen_reqs=reqs, num_gen_tokens=reqs).name()


def test_sglang_loads_the_plugin_and_applies_its_hooks():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("stepscope") == "stepscope.sglang:register"
    cls = pm.SchedulerProfilerManager
    for name in ("_profile", "_profile_batch_predicate"):
        assert getattr(cls, name).__wrapped__ is not None, name
    plugin.register()  # idempotent: no second hook
    assert not hasattr(cls._profile.__wrapped__, "__wrapped__")


def test_start_step_and_num_steps_capture_exactly_those_forward_passes(tmp_path):
    s = Scheduler()
    for _ in range(3):
        s.run(P)
    reply = s.profile(**profile_req(tmp_path, "aligned", start_step=6, num_steps=3))
    assert reply.success, reply.message
    for _ in range(9):  # forward passes 4..12
        s.run(P)
    m = wait_complete(tmp_path / "aligned-TP-0.stepscope.json")
    assert m["trace_file"] == "aligned-TP-0.trace.json.gz"
    assert m["iterations"] == 3
    assert annotations(tmp_path / m["trace_file"]) == [prefill(6), prefill(7), prefill(8)]
    # SGLang's own profiler never ran; a request after the window is accepted again.
    assert s.manager.torch_profiler is None and not s.manager.profile_in_progress
    assert s.profile(**profile_req(tmp_path, "again", num_steps=1)).success
    assert s.stop().success


def test_with_request_ids_each_captured_batch_names_its_rids(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_CONFIG", '{"stepscope": {"request_ids": true}}')
    s = Scheduler()
    s.run(P)
    assert s.profile(**profile_req(tmp_path, "rids", num_steps=2)).success
    s.run(P, reqs=2)  # 2
    s.run(D, reqs=3)  # 3
    s.run(D, reqs=1)  # 4: past the window
    m = wait_complete(tmp_path / "rids-TP-0.stepscope.json")
    # Steps count from the profiler's creation at the request; the rids are forward pass 2's
    # and 3's.
    assert m["steps"] == [
        {"step": 1, "requests": ["2.0", "2.1"]},
        {"step": 2, "requests": ["3.0", "3.1", "3.2"]},
    ]


def test_a_start_step_already_passed_is_refused_naming_it(tmp_path):
    s = Scheduler()
    for _ in range(5):
        s.run(D)
    reply = s.profile(**profile_req(tmp_path, "late", start_step=3, num_steps=2))
    assert not reply.success
    assert "start_step 3 has passed" in reply.message and "forward pass 5" in reply.message
    s.run(D)
    assert not list(tmp_path.iterdir())


def test_profile_by_stage_writes_one_trace_per_stage_named_as_sglang_does(tmp_path):
    s = Scheduler()
    s.run(D)
    reply = s.profile(**profile_req(tmp_path, "st", profile_by_stage=True, num_steps=2,
                                    profile_prefix="pre"))  # fmt: skip
    assert reply.success, reply.message
    s.run(I)  # idle: no stage
    for _ in range(3):  # 3, 4, 5: the window ends at the count
        s.run(P)
    s.run(M, reqs=3, decoding=2)  # 6: mixed counts as prefill, but that window is done
    for _ in range(3):  # 7, 8, 9
        s.run(D, reqs=4)
    s.run(P)  # 10: both stages done
    extend = wait_complete(tmp_path / "pre-st-TP-0-EXTEND.stepscope.json")
    dec = wait_complete(tmp_path / "pre-st-TP-0-DECODE.stepscope.json")
    assert annotations(tmp_path / extend["trace_file"]) == [prefill(3), prefill(4)]
    assert annotations(tmp_path / dec["trace_file"]) == [decode(4), decode(4)]
    assert extend["trace_file"] == "pre-st-TP-0-EXTEND.trace.json.gz"
    names = sorted(p.name for p in tmp_path.iterdir())
    # With CPU the only activity the op table is written too, as stepscope does for vLLM.
    assert names == [
        "pre-st-TP-0-DECODE.profiler_out.txt", "pre-st-TP-0-DECODE.stepscope.json",
        "pre-st-TP-0-DECODE.trace.json.gz", "pre-st-TP-0-EXTEND.profiler_out.txt",
        "pre-st-TP-0-EXTEND.stepscope.json", "pre-st-TP-0-EXTEND.trace.json.gz",
    ]  # fmt: skip


def test_by_stage_windows_begin_at_start_step(tmp_path):
    s = Scheduler()
    s.run(P)
    s.run(P)
    reply = s.profile(**profile_req(tmp_path, "late", profile_by_stage=True, num_steps=2,
                                    start_step=5))  # fmt: skip
    assert reply.success, reply.message
    for _ in range(5):  # 3, 4: before start_step; 5, 6 captured; 7 ends the window
        s.run(P)
    for _ in range(3):  # 8, 9 captured; 10 ends it
        s.run(D)
    extend = wait_complete(tmp_path / "late-TP-0-EXTEND.stepscope.json")
    dec = wait_complete(tmp_path / "late-TP-0-DECODE.stepscope.json")
    assert annotations(tmp_path / extend["trace_file"]) == [prefill(5), prefill(6)]
    assert annotations(tmp_path / dec["trace_file"]) == [decode(), decode()]


def test_a_stage_window_ends_at_a_batch_of_another_stage_and_stages_can_be_chosen(tmp_path):
    s = Scheduler()
    reply = s.profile(**profile_req(tmp_path, "mix", profile_by_stage=True, num_steps=5))
    assert reply.success, reply.message
    s.run(P)  # 1
    s.run(M, reqs=3, tokens=150, decoding=1)  # 2: still prefill
    s.run(D, reqs=3)  # 3: ends the prefill window after 2 of 5
    s.run(D, reqs=3)
    s.stop()
    extend = wait_complete(tmp_path / "mix-TP-0-EXTEND.stepscope.json")
    mixed = stepscope.Iteration(num_ctx_reqs=2, num_ctx_tokens=149, num_gen_reqs=1,
                                num_gen_tokens=1).name()  # fmt: skip
    assert annotations(tmp_path / extend["trace_file"]) == [prefill(1, reqs=2), mixed]
    dec = wait_complete(tmp_path / "mix-TP-0-DECODE.stepscope.json")
    assert annotations(tmp_path / dec["trace_file"]) == [decode(3), decode(3)]

    only = tmp_path / "only"
    s.profile(**profile_req(only, "dec", profile_by_stage=True, num_steps=1,
                            profile_stages=["decode"]))  # fmt: skip
    s.run(P)
    s.run(D)
    s.run(D)
    wait_complete(only / "dec-TP-0-DECODE.stepscope.json")
    assert sorted(p.name for p in only.iterdir()) == [
        "dec-TP-0-DECODE.profiler_out.txt", "dec-TP-0-DECODE.stepscope.json",
        "dec-TP-0-DECODE.trace.json.gz",
    ]  # fmt: skip


def test_stop_profile_ends_a_capture_without_a_count(tmp_path):
    s = Scheduler()
    assert s.profile(**profile_req(tmp_path, "manual")).success
    for _ in range(3):
        s.run(P)
    reply = s.stop()
    assert reply.success and "stepscope" in reply.message, reply.message
    m = wait_complete(tmp_path / "manual-TP-0.stepscope.json")
    assert annotations(tmp_path / m["trace_file"]) == [prefill(1), prefill(2), prefill(3)]
    # Nothing in progress: SGLang answers the stop.
    assert not s.stop().success


def test_requests_stepscope_refuses_name_the_field(tmp_path):
    s = Scheduler()
    cases = [
        (dict(profile_by_stage=True), "profile_by_stage needs num_steps"),
        (dict(profile_by_stage=True, num_steps=1, profile_stages=["verify"]), "profile_stages"),
        (dict(profile_stages=["decode"], num_steps=1), "profile_stages needs profile_by_stage"),
    ]
    for fields, message in cases:
        reply = s.profile(**profile_req(tmp_path, "bad", **fields))
        assert not reply.success and message in reply.message, (fields, reply.message)
    assert s.profile(**profile_req(tmp_path, "one", num_steps=2)).success
    busy = s.profile(**profile_req(tmp_path, "two", num_steps=2))
    assert not busy.success and "already in progress" in busy.message
    assert s.stop().success


def test_what_stepscope_cannot_record_goes_to_sglangs_own_profiler(tmp_path, caplog):
    s = Scheduler()
    caplog.set_level(logging.INFO, logger="stepscope.sglang")
    # A stepscope capture just ended: its trace is still being written (the writer finalizes
    # Kineto's session, then writes the manifest with an fsync, before the trace), and Kineto
    # is one profiler per process. A request only SGLang's own profiler can serve is refused
    # until the trace is written, not started into a crash.
    assert s.profile(**profile_req(tmp_path / "ours", "ours", num_steps=1)).success
    s.run(P, reqs=500)
    s.run(P)
    refused = s.profile(**profile_req(tmp_path, "own", activities=["CPU", "FOO"]))
    assert not refused.success, "SGLang's own profiler started while stepscope was writing"
    assert "cannot start while stepscope still writes" in refused.message, refused.message
    deadline = time.monotonic() + 120
    while stepscope.traces_in_flight():
        assert time.monotonic() < deadline, "stepscope's trace was never written"
        time.sleep(0.05)
    wait_complete(tmp_path / "ours" / "ours-TP-0.stepscope.json")
    reply = s.profile(**profile_req(tmp_path, "own", activities=["CPU", "FOO"]))
    assert reply.success, reply.message
    assert "SGLang's own profiler serves this request: activities FOO" in caplog.text
    assert s.manager.profile_in_progress and s.manager.torch_profiler is not None
    s.run(P)
    assert s.stop().success
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours", "own-TP-0.trace.json.gz"]


def test_merge_profiles_runs_stepscope_merge_after_the_traces_are_written(tmp_path, monkeypatch):
    cli = os.environ.get(plugin.CLI_ENV) or str(REPO / "target" / "debug" / "stepscope")
    if not Path(cli).is_file():
        pytest.skip("the stepscope command is not built (make test builds it)")
    monkeypatch.setenv(plugin.CLI_ENV, cli)
    s = Scheduler()
    reply = s.profile(**profile_req(tmp_path, "merged", num_steps=2, merge_profiles=True))
    assert reply.success, reply.message
    for _ in range(3):
        s.run(P)
    merged = tmp_path / "merged-merged.trace.json.gz"
    deadline = time.monotonic() + 120
    while not merged.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # renamed into place once whole
    with gzip.open(merged, "rt") as f:
        events = json.load(f)["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert names == [prefill(1), prefill(2)]


def test_an_sglang_the_plugin_does_not_know_keeps_its_own_profiler(caplog):
    class Manager:
        def _profile(self, recv_req, extra):
            pass

        def _profile_batch_predicate(self, batch):
            pass

    module = SimpleNamespace(__name__="fake", SchedulerProfilerManager=Manager,
                             ProfileReq=pm.ProfileReq)  # fmt: skip
    plugin._warned.discard("interface")
    assert not plugin.interface_known(module)
    assert "SchedulerProfilerManager._profile(self, recv_req, extra)" in caplog.text
    assert plugin.interface_known(pm)


def test_cuda_profiler_drives_the_cuda_backend_with_one_nvtx_range_per_batch(engine_script):
    """``CUDA_PROFILER`` on the stub driver and the NVTX recorder, in a child process (the
    loader must see the stub from the start)."""
    r = engine_script(
        f"""
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_sglang as t
        with t.scheduler_process():
            s = t.Scheduler()
            s.run(t.D)
            reply = s.profile(profile_id="nsys", activities=["CUDA_PROFILER"], num_steps=2)
            RESULT["reply"] = [reply.success, reply.message]
            for _ in range(4):
                s.run(t.D, reqs=5)
        """
    )
    assert r.result["reply"] == [True, "Succeeded"]
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")]
    pushes = [e.arg(1) for e in r.events if e.name == "push"]
    assert pushes == [decode(5), decode(5)]
