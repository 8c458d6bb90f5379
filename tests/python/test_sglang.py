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
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

import stepscope  # noqa: E402
import stepscope.sglang as plugin  # noqa: E402
from sglang_harness import D, I, M, P, Scheduler, pm, scheduler_process  # noqa: E402, F401

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def sglang_process():
    with scheduler_process():
        yield


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


def built_cli() -> str:
    """The built ``stepscope`` command (``STEPSCOPE_CLI``, else the workspace's debug build);
    skips the test where it is not built."""
    cli = os.environ.get(plugin.CLI_ENV) or str(REPO / "target" / "debug" / "stepscope")
    if not Path(cli).is_file():
        pytest.skip("the stepscope command is not built (make test builds it)")
    return cli


def analyze_requests(cli: str, trace: Path) -> dict:
    """``stepscope analyze --json --requests=0 TRACE``'s document."""
    out = subprocess.run(
        [cli, "analyze", "--json", "--requests=0", str(trace)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


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
    # With each one's tokens (its extend length; one in decode) and phase.
    assert m["steps"] == [
        {"step": 1, "requests": ["2.0", "2.1"], "tokens": [51, 51], "prefill": [True, True]},
        {"step": 2, "requests": ["3.0", "3.1", "3.2"], "tokens": [1, 1, 1],
         "prefill": [False, False, False]},
    ]  # fmt: skip


def test_analyze_requests_reads_a_capture_of_sglang_batches_back_per_request(tmp_path, monkeypatch):
    cli = built_cli()
    monkeypatch.setenv("STEPSCOPE_CONFIG", '{"stepscope": {"request_ids": true}}')
    s = Scheduler()
    assert s.profile(**profile_req(tmp_path, "shares", num_steps=3)).success
    s.run(P, reqs=2, tokens=300)  # 1: two extends of 150
    s.run(M, reqs=3, tokens=42, decoding=2)  # 2: one extend of 40, two decodes
    s.run(D, reqs=2)  # 3
    s.run(D, reqs=2)  # past the window
    m = wait_complete(tmp_path / "shares-TP-0.stepscope.json")
    doc = analyze_requests(cli, tmp_path / m["trace_file"])
    (steps,) = [t["steps"] for t in doc["traces"]]
    # Each iteration's requests, tokens and phases sum to the counts in its name.
    assert [st["name"] for st in steps] == [
        stepscope.Iteration(2, 300).name(),
        stepscope.Iteration(1, 40, 2, 2).name(),
        decode(2),
    ]
    assert [(st["tokens"], st["prefill"]) for st in steps] == [
        ([150, 150], [True, True]),
        ([40, 1, 1], [True, False, False]),
        ([1, 1], [False, False]),
    ]
    (listed,) = doc["requests"]
    by_id = {r["id"]: r for r in listed["requests"]}
    # Rids are "{forward pass}.{i}": the mixed batch is forward pass 2.
    assert (by_id["2.0"]["prefill"]["tokens"], by_id["2.0"]["decode"]) == (40, None)
    assert by_id["2.1"]["decode"]["steps"] == 1 and by_id["2.1"]["prefill"] is None
    # The mixed batch's extend was the largest prefill its decodes shared it with.
    (worst,) = by_id["2.2"]["costliest"]
    assert (worst["largest_prefill_request"], worst["largest_prefill_tokens"]) == ("2.0", 40)
    assert abs(sum(r["cpu_ms"] for r in listed["requests"])
               - sum(st["cpu_op_us"] for st in steps) / 1e3) < 1e-6  # fmt: skip


def test_a_mixed_batch_tells_its_decoding_requests_from_its_extends(monkeypatch):
    batch = SimpleNamespace(
        forward_mode=M,
        reqs=[SimpleNamespace(rid=r) for r in ("new", "old1", "old2")],
        extend_num_tokens=42,
        extend_lens=[40, 1, 1],
        decoding_reqs=None,
    )
    batch.decoding_reqs = batch.reqs[1:]
    it = plugin.iteration_of(batch, ["new", "old1", "old2"])
    assert (it.request_tokens, it.request_prefill) == ([40, 1, 1], [True, False, False])
    assert it.name() == stepscope.Iteration(1, 40, 2, 2).name()
    # Lengths that do not match the requests are left out, the ids kept.
    batch.extend_lens = [42]
    it = plugin.iteration_of(batch, ["new", "old1", "old2"])
    assert it.request_ids == ["new", "old1", "old2"] and it.request_tokens is None


def test_a_start_step_already_passed_begins_in_the_next_forward_pass_as_sglangs_does(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="stepscope.sglang")
    s = Scheduler()
    for _ in range(5):
        s.run(D)
    reply = s.profile(**profile_req(tmp_path, "late", start_step=3, num_steps=2))
    assert reply.success, reply.message
    assert "start_step 3 has passed on this rank (forward pass 5)" in caplog.text
    for _ in range(3):  # 6, 7 captured; 8 ends the window
        s.run(D, reqs=3)
    m = wait_complete(tmp_path / "late-TP-0.stepscope.json")
    assert annotations(tmp_path / m["trace_file"]) == [decode(3), decode(3)]
    # The manifest says which forward pass the window began in.
    assert m["metadata"]["sglang_first_forward_pass"] == 6


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


def test_by_stage_windows_begin_at_each_stages_first_batch_whatever_the_start_step(tmp_path):
    """SGLang's own by-stage profiler does not read start_step; neither does stepscope."""
    s = Scheduler()
    s.run(P)
    s.run(P)
    reply = s.profile(**profile_req(tmp_path, "late", profile_by_stage=True, num_steps=2,
                                    start_step=5))  # fmt: skip
    assert reply.success, reply.message
    for _ in range(3):  # 3, 4 captured; 5 ends the window
        s.run(P)
    for _ in range(3):  # 6, 7 captured; 8 ends it
        s.run(D)
    extend = wait_complete(tmp_path / "late-TP-0-EXTEND.stepscope.json")
    dec = wait_complete(tmp_path / "late-TP-0-DECODE.stepscope.json")
    assert annotations(tmp_path / extend["trace_file"]) == [prefill(3), prefill(4)]
    assert annotations(tmp_path / dec["trace_file"]) == [decode(), decode()]
    assert (extend["metadata"]["sglang_first_forward_pass"],
            dec["metadata"]["sglang_first_forward_pass"]) == (3, 6)  # fmt: skip


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


def wait_written(timeout: float = 120.0) -> None:
    """Until no trace of this process is in flight."""
    deadline = time.monotonic() + timeout
    while stepscope.traces_in_flight():
        assert time.monotonic() < deadline, "stepscope's traces were never written"
        time.sleep(0.05)


@contextlib.contextmanager
def manifest_write_held(directory: Path, stem: str):
    """The writer's first write of ``{stem}.stepscope.json`` (its ``"writing"`` manifest) hangs
    until the block ends, as on a disk that stopped answering: a FIFO at the temporary name it
    writes through (``.{name}.{pid}.partial``) blocks its open until a reader comes. The
    reader takes what it writes; that write fails then (a FIFO cannot be fsynced), the FIFO
    is removed with the temporary, and the job goes on. Yields a list that receives the
    held manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    fifo = directory / f".{stem}.stepscope.json.{os.getpid()}.partial"
    os.mkfifo(fifo)
    held: list[dict] = []
    try:
        yield held
    finally:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            got, deadline = b"", time.monotonic() + 120
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:  # the writer is there, its bytes are not yet
                    chunk = None
                if chunk:
                    got += chunk
                elif chunk == b"" and got:  # written and closed
                    break
                assert time.monotonic() < deadline, "the writer never wrote the manifest"
                time.sleep(0.01)
        finally:
            os.close(fd)
        held.append(json.loads(got))


def test_what_stepscope_cannot_record_goes_to_sglangs_own_profiler(tmp_path, caplog):
    s = Scheduler()
    caplog.set_level(logging.INFO, logger="stepscope.sglang")
    # A stepscope capture just ended: its trace is still being written (here held at its
    # first manifest write, which its final manifest waits behind), and Kineto is one
    # profiler per process. A request only SGLang's own profiler can serve is refused until
    # the trace is written, not started into a crash.
    wait_written()  # earlier tests' traces: the count below is this test's
    with manifest_write_held(tmp_path / "ours", "ours-TP-0") as held:
        assert s.profile(**profile_req(tmp_path / "ours", "ours", num_steps=1)).success
        s.run(P, reqs=500)
        s.run(P)
        refused = s.profile(**profile_req(tmp_path, "own", activities=["CPU", "FOO"]))
        assert stepscope.traces_in_flight() == 1
    assert not refused.success, "SGLang's own profiler started while stepscope was writing"
    assert "cannot start while stepscope still writes 1 trace(s)" in refused.message, (
        refused.message
    )
    assert held[0]["status"] == "writing"
    wait_written()
    wait_complete(tmp_path / "ours" / "ours-TP-0.stepscope.json")
    reply = s.profile(**profile_req(tmp_path, "own", activities=["CPU", "FOO"]))
    assert reply.success, reply.message
    assert "SGLang's own profiler serves this request: activities FOO" in caplog.text
    assert s.manager.profile_in_progress and s.manager.torch_profiler is not None
    s.run(P)
    assert s.stop().success
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours", "own-TP-0.trace.json.gz"]
    assert not list((tmp_path / "ours").glob(".*")), "a temporary left behind"


def test_merge_profiles_runs_stepscope_merge_after_the_traces_are_written(tmp_path, monkeypatch):
    cli = built_cli()
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
    v2 = importlib.import_module(plugin.V2_MODULE)
    plugin.interface._warned.discard("interface")
    assert not plugin.interface_known(module, v2)
    assert "SchedulerProfilerManager._profile(self, recv_req, extra)" in caplog.text
    assert plugin.interface_known(pm, v2)


def test_cuda_profiler_drives_the_cuda_backend_with_one_nvtx_range_per_batch(engine_script):
    """``CUDA_PROFILER`` on the stub driver and the NVTX recorder, in a child process (the
    loader must see the stub from the start)."""
    r = engine_script(
        f"""
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import sglang_harness as t
        with t.scheduler_process():
            s = t.Scheduler()
            s.run(t.D)
            reply = s.profile(profile_id="nsys", activities=["CUDA_PROFILER"], num_steps=2)
            RESULT["reply"] = [reply.success, reply.message]
            for _ in range(4):
                s.run(t.D, reqs=5)
            # The second GPU of the node: SGLang calls cudaProfilerStart on the first only.
            from sglang.srt.runtime_context import get_device
            with get_device().override(gpu_id=1):
                s = t.Scheduler()
                reply = s.profile(profile_id="nsys1", activities=["CUDA_PROFILER"], num_steps=2)
                RESULT["second"] = [reply.success, reply.message]
                for _ in range(4):
                    s.run(t.D, reqs=5)
        """
    )
    assert r.result["reply"] == [True, "Succeeded"]
    assert r.result["second"] == [True, "Succeeded"]
    # One start and one stop: the first GPU's.
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")]
    pushes = [e.arg(1) for e in r.events if e.name == "push"]
    assert pushes == [decode(5), decode(5)]


def test_a_start_while_a_window_runs_is_refused_and_the_window_goes_on(tmp_path):
    """SGLang's own refuses in _init_profile, then calls _start_profile anyway, which replaces
    its running torch.profiler without writing it; stepscope refuses and keeps the window."""
    s = Scheduler()
    assert s.profile(**profile_req(tmp_path, "first")).success
    s.run(P)
    busy = s.profile(**profile_req(tmp_path, "second"))
    assert not busy.success and "already in progress" in busy.message
    s.run(P)
    assert s.stop().success
    m = wait_complete(tmp_path / "first-TP-0.stepscope.json")
    assert annotations(tmp_path / m["trace_file"]) == [prefill(1), prefill(2)]
    assert sorted(p.name for p in tmp_path.glob("*.trace.json.gz")) == ["first-TP-0.trace.json.gz"]


def test_a_pending_start_step_reached_during_a_later_window_does_not_restart_it(tmp_path):
    """A /stop_profile before a start_step window began leaves SGLang's start forward count
    set: SGLang starts again there, inside whatever window runs then. stepscope's window of
    the same name goes on."""
    s = Scheduler()
    assert s.profile(**profile_req(tmp_path, "early", start_step=3)).success
    assert not s.stop().success  # SGLang's answer: nothing in progress (the start stays)
    assert s.profile(**profile_req(tmp_path, "manual")).success
    for _ in range(4):  # 1..4; forward 3 is the stale start
        s.run(P)
    assert s.stop().success
    m = wait_complete(tmp_path / "manual-TP-0.stepscope.json")
    assert annotations(tmp_path / m["trace_file"]) == [prefill(i) for i in (1, 2, 3, 4)]


def test_a_stage_window_begun_inside_another_stages_writes_both(tmp_path):
    """By stage, a decode batch first begins the decode window; a prefill batch inside it
    begins the prefill window (SGLang's own drops the decode window's profiler there)."""
    s = Scheduler()
    reply = s.profile(**profile_req(tmp_path, "both", profile_by_stage=True, num_steps=2))
    assert reply.success, reply.message
    s.run(D, reqs=3)  # 1: the decode window
    s.run(P)  # 2: the prefill window; the decode one is written as it stands
    s.run(P)  # 3
    s.run(P)  # 4: ends the prefill window
    dec = wait_complete(tmp_path / "both-TP-0-DECODE.stepscope.json")
    extend = wait_complete(tmp_path / "both-TP-0-EXTEND.stepscope.json")
    assert annotations(tmp_path / dec["trace_file"]) == [decode(3)]
    assert annotations(tmp_path / extend["trace_file"]) == [prefill(2), prefill(3)]


def test_profile_stages_chooses_the_windows_without_v2_too(tmp_path):
    """SGLang's default profiler ignores profile_stages (its V2 honours it); stepscope honours
    it under both."""
    s = Scheduler()
    reply = s.profile(**profile_req(tmp_path, "dec", profile_by_stage=True, num_steps=2,
                                    profile_stages=["decode"]))  # fmt: skip
    assert reply.success, reply.message
    for mode in (P, P, D, D, D, P):
        s.run(mode)
    m = wait_complete(tmp_path / "dec-TP-0-DECODE.stepscope.json")
    assert annotations(tmp_path / m["trace_file"]) == [decode(), decode()]
    assert sorted(p.name for p in tmp_path.glob("*.trace.json.gz")) == [
        "dec-TP-0-DECODE.trace.json.gz"
    ]


def test_under_profile_v2_windows_follow_its_stage_trigger_and_what_it_asserts_is_refused(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SGLANG_PROFILE_V2", "1")
    s = Scheduler()
    assert s.manager._profile_manager is not None
    cases = [
        (dict(), "only by stage"),
        (dict(profile_by_stage=True, num_steps=2, start_step=4), "start_step is not supported"),
        (dict(profile_by_stage=True, num_steps=2, merge_profiles=True), "merge_profiles"),
    ]
    for fields, message in cases:
        reply = s.profile(**profile_req(tmp_path, "bad", **fields))
        assert not reply.success and message in reply.message, (fields, reply.message)
    reply = s.profile(**profile_req(tmp_path, "v2", profile_by_stage=True, num_steps=2))
    assert reply.success, reply.message
    s.run(P)  # 1
    s.run(I)  # 2: idle, inside the window, not counted
    s.run(P)  # 3
    s.run(D)  # 4: ends the prefill window (another stage), begins the decode one
    busy = s.profile(**profile_req(tmp_path, "v2b", profile_by_stage=True, num_steps=2))
    assert not busy.success and "already in progress" in busy.message
    s.run(D)  # 5
    # V2's own manual stop raises NotImplementedError; stepscope's ends the running window.
    reply = s.stop()
    assert reply.success, reply.message
    s.run(D)
    extend = wait_complete(tmp_path / "v2-TP-0-prefill.stepscope.json")
    dec = wait_complete(tmp_path / "v2-TP-0-decode.stepscope.json")
    idle = stepscope.Iteration().name()
    assert annotations(tmp_path / extend["trace_file"]) == [prefill(1), idle, prefill(3)]
    assert annotations(tmp_path / dec["trace_file"]) == [decode(), decode()]
    assert not s.stop().success  # nothing runs, nothing pending


def ctl_against_server_info(internal_state: dict, *args: str):
    """Runs ``stepscope ctl ARGS --worker URL`` where URL serves ``/server_info`` with this
    scheduler's internal state (a plain HTTP server: SGLang's HTTP layer's place); skipped when
    the command is not built."""
    import http.server
    import threading

    info = json.dumps({"version": "0.5.23", "internal_states": [internal_state]}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/server_info" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(info)

        def log_message(self, *args):
            pass

    cli = built_cli()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        return subprocess.run(
            [cli, "ctl", *args, "--worker", f"http://127.0.0.1:{server.server_port}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()


def test_server_info_carries_each_schedulers_status_and_ctl_status_reads_it(tmp_path):
    """The hook on SGLang's internal-state controller adds the scheduler's stepscope status to
    its GetInternalStateReqOutput; `stepscope ctl status --engine sglang` reads /server_info
    (here served by a plain HTTP server with that output, SGLang's HTTP layer's place)."""
    from sglang.srt.managers.io_struct import GetInternalStateReq, GetInternalStateReqOutput

    ism = importlib.import_module(plugin.STATE_MODULE)
    hooked = ism.SchedulerInternalStateController.get_internal_state
    assert hooked.__wrapped__ is not None, "the /server_info hook is not applied"
    s = Scheduler()
    assert s.profile(**profile_req(tmp_path, "st", num_steps=5)).success
    s.run(D, reqs=3)
    controller = SimpleNamespace(scheduler=SimpleNamespace(profiler_manager=s.manager))
    out = plugin.hooks.after_internal_state(
        GetInternalStateReqOutput(internal_state={"max_total_num_tokens": 8}),
        controller,
        GetInternalStateReq(),
    )
    mine = out.internal_state["stepscope"]
    assert mine["plugin"] == "sglang" and mine["workers"][0]["phase"] == "running"
    try:
        run = ctl_against_server_info(out.internal_state, "status", "--engine", "sglang", "--json")
    finally:
        s.stop()
    assert run.returncode == 0, run.stderr
    (outcome,) = json.loads(run.stdout)["workers"]
    assert outcome["ok"] and outcome["engine_workers"][0]["phase"] == "running", outcome


def test_the_step_timeline_times_every_forward_batch_and_ctl_top_reads_it(monkeypatch):
    """With ``"stepscope": {"timeline": ...}`` every forward batch is a step of the scheduler's
    timeline from the first (no /start_profile needed), carried by /server_info with the
    batch's counts as the plugin names them for a trace; `stepscope ctl top --engine sglang`
    reads it (here from a plain HTTP server with that output, SGLang's HTTP layer's place)."""
    from sglang.srt.managers.io_struct import GetInternalStateReq, GetInternalStateReqOutput

    monkeypatch.setattr(plugin.status, "_timeline_setting", [{"steps": 64}])
    s = Scheduler()
    batches = [(P, 2), (D, 2), (D, 2), (P, 1), (D, 3), (D, 3)]
    for mode, reqs in batches:
        s.run(mode, reqs=reqs)
    s.run(D, reqs=3)  # ends the last batch's step (SGLang has no end-of-batch call)
    controller = SimpleNamespace(scheduler=SimpleNamespace(profiler_manager=s.manager))
    out = plugin.hooks.after_internal_state(
        GetInternalStateReqOutput(internal_state={}), controller, GetInternalStateReq()
    )
    timeline = out.internal_state["stepscope"]["timeline"]
    steps = [dict(zip(timeline["fields"], t, strict=True)) for t in timeline["steps"]]
    assert [t["step"] for t in steps] == list(range(1, len(batches) + 1))
    # Each step's counts are those the plugin gives a captured batch (its trace annotation).
    for t, (mode, reqs) in zip(steps, batches, strict=True):
        counts = stepscope.Iteration(
            t["num_ctx_reqs"], t["num_ctx_tokens"], t["num_gen_reqs"], t["num_gen_tokens"]
        ).name()
        assert counts == (prefill(t["step"], reqs) if mode == P else decode(reqs)), t
    assert timeline["phase"] == "idle" and timeline["timeline"]["capacity"] == 64

    run = ctl_against_server_info(
        out.internal_state, "top", "--engine", "sglang", "--once", "--json", "--since-step", "0"
    )
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(run.stdout)["workers"]
    assert row["steps"] == len(batches)
    assert row["mean_requests"] == pytest.approx(sum(r for _, r in batches) / len(batches))
    durations = sorted(t["duration_ns"] / 1e6 for t in steps)
    assert row["max_ms"] == pytest.approx(durations[-1])


def test_a_stop_answers_at_once_and_server_info_then_says_where_each_trace_is(tmp_path):
    """SGLang's stop is answered at once (its message says how to wait); the scheduler's
    status in /server_info lists each trace with where it is and how its write ended, which
    `stepscope ctl stop --wait --engine sglang` polls."""
    from sglang.srt.managers.io_struct import GetInternalStateReq, GetInternalStateReqOutput

    s = Scheduler()
    assert s.profile(**profile_req(tmp_path, "waited")).success
    for _ in range(2):
        s.run(P)
    reply = s.stop()
    assert reply.success and f"stepscope wait {tmp_path}" in reply.message, reply.message
    for p in plugin.window.state_of(s.manager).profilers:
        assert p.flush(60)
    controller = SimpleNamespace(scheduler=SimpleNamespace(profiler_manager=s.manager))
    out = plugin.hooks.after_internal_state(
        GetInternalStateReqOutput(internal_state={}), controller, GetInternalStateReq()
    )
    (worker,) = out.internal_state["stepscope"]["workers"]
    assert not worker["running"] and not worker["stopping"] and worker["pending_writes"] == 0
    trace = worker["traces"][-1]
    assert trace["status"] == "complete", trace
    assert trace["trace_file"] == str(tmp_path / "waited-TP-0.trace.json.gz")
    assert Path(trace["trace_file"]).is_file()



def sglang_scheduler(manager, sent: list):
    """SGLang's own ``Scheduler`` as far as ``process_input_requests`` (with the plugin's hook)
    and ``send_control_output`` see it: its control requests dispatched to ``manager``, its
    answers to the tokenizer collected in ``sent`` (the ZMQ socket's place)."""
    import sglang.srt.managers.scheduler as sm

    sched = sm.Scheduler.__new__(sm.Scheduler)
    sched.session_controller = SimpleNamespace(maybe_reap=lambda now: None)
    sched.flush_wrapper = SimpleNamespace(check_pending=lambda: None)
    sched.external_corpus_manager = None
    sched.rust_server = None
    sched.ipc_channels = SimpleNamespace(
        send_to_tokenizer=SimpleNamespace(send_output=lambda out, req: sent.append(out)),
        recv_from_rpc=None,
    )
    sched._request_dispatcher = manager._profile
    sched._event_loop_should_restart = False
    sched.scheduler_stage_metrics = None  # SGLang's own: no stage metrics recorded
    return sched


def test_a_stop_dispatched_by_sglangs_scheduler_is_answered_once_its_traces_are_written(
    tmp_path,
):
    """SGLang's scheduler answers a control request at dispatch or later
    (``send_control_output``): the plugin answers a stop once its traces are written, while the
    scheduler loop and its batches go on, and a stop whose trace could not be written is
    answered as a failure naming it."""
    import sglang.srt.managers.scheduler as sm
    from sglang.srt.managers.io_struct import ProfileReq, ProfileReqType

    assert sm.Scheduler.process_input_requests.__wrapped__ is not None, "the hook is not applied"
    s = Scheduler()
    sent: list = []
    sched = sglang_scheduler(s.manager, sent)
    dispatch = lambda *reqs: sched.process_input_requests(list(reqs))  # noqa: E731
    dispatch(ProfileReq(**profile_req(tmp_path, "deferred")))
    assert len(sent) == 1 and sent[0].success, sent
    s.run(P)
    s.run(P)
    with manifest_write_held(tmp_path, "deferred-TP-0"):
        dispatch(ProfileReq(req_type=ProfileReqType.STOP_PROFILE))
        # The loop and the batches go on; the stop is not answered while its trace cannot
        # be written.
        for _ in range(20):
            dispatch()
            s.run(D)
        assert len(sent) == 1, [r.message for r in sent]
    deadline = time.monotonic() + 120
    while len(sent) < 2:
        assert time.monotonic() < deadline, "the stop was never answered"
        dispatch()
        time.sleep(0.01)
    reply = sent[1]
    trace = tmp_path / "deferred-TP-0.trace.json.gz"
    assert reply.success and str(trace) in reply.message, reply.message
    # Acted on at once, as a client would: whole, its manifest complete.
    assert json.loads((tmp_path / "deferred-TP-0.stepscope.json").read_text())["status"] == "complete"
    # (SGLang's own span around process_input_requests is in the window too.)
    steps = [a for a in annotations(trace) if a.startswith("execute_")]
    assert steps == [prefill(1), prefill(2)]

    # A trace that cannot be written: the stop's answer is a failure naming it.
    out = tmp_path / "gone"
    dispatch(ProfileReq(**profile_req(out, "lost")))
    s.run(P)
    for f in out.iterdir():
        f.unlink()
    out.rmdir()
    out.write_text("not a directory any more")
    dispatch(ProfileReq(req_type=ProfileReqType.STOP_PROFILE))
    while len(sent) < 4:
        assert time.monotonic() < deadline, "the failed stop was never answered"
        dispatch()
        time.sleep(0.01)
    failed = sent[3]
    assert not failed.success and "lost-TP-0.trace.json.gz" in failed.message, failed.message


# -- request lifecycles ("stepscope": {"requests": true}) --


@pytest.fixture
def request_log(monkeypatch):
    """The log on, as a scheduler process started with it has it: SGLang's own HookRegistry
    applies the plugin's hooks to its ``Scheduler`` (as ``load_plugins`` does when the key is
    set), and the process's log is made afresh."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    monkeypatch.setenv("STEPSCOPE_CONFIG", '{"stepscope": {"requests": true}}')
    lc = plugin.lifecycles
    monkeypatch.setattr(lc, "_log", None)
    monkeypatch.setattr(lc, "_tried", False)
    monkeypatch.setattr(lc, "_in_flight", {})
    assert lc.scheduler_known(), "SGLang 0.5.23's Scheduler is not what the log hooks"
    for target, hook in lc.hooks():
        if target not in HookRegistry._patched:
            HookRegistry.register(target, hook, HookType.AROUND)
    HookRegistry.apply_hooks()
    yield lc.request_log()


def sglang_queue():
    """SGLang's own ``Scheduler`` as far as ``_add_request_to_queue`` reads it: no
    disaggregation, no priorities, no queue limit, no KV storage to prefetch from."""
    import sglang.srt.managers.scheduler as sm
    from sglang.srt.disaggregation.utils import DisaggregationMode

    sched = sm.Scheduler.__new__(sm.Scheduler)
    sched.enable_priority_scheduling = False
    sched.abort_on_priority_when_disabled = False
    sched.disaggregation_mode = DisaggregationMode.NULL
    sched.max_queued_requests = None
    sched.waiting_queue = []
    sched.enable_hicache_storage = False
    sched.enable_lmcache = False
    sched.processed_tokens_counter = 0
    return sched


def new_req(rid: str, prompt: int, max_new: int):
    """A real SGLang request of ``prompt`` token ids that ends at ``max_new`` tokens."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
    params.normalize(None)  # as SGLang's tokenizer manager does (no tokenizer: token ids)
    return Req(rid, "", [3 + k % 500 for k in range(prompt)], params)


class Loop:
    """What SGLang's scheduler loop does to its requests, around the plugin's hooks on
    ``run_batch`` and ``process_batch_result`` (whose own bodies need a model): a batch
    leaves the waiting queue, runs, and its result appends one token to each request that
    finished its prompt and lets SGLang's ``Req.update_finish_state`` decide whether it
    ended. ``overlap``: results are processed one batch late, with a copy of the batch
    (SGLang's overlap loop)."""

    def __init__(self, sched, overlap: bool = False, profiled: Scheduler | None = None) -> None:
        self.sched = sched
        self.overlap = overlap
        #: A profiler manager's scheduler: each batch also goes to its predicate, as
        #: SGLang's run_batch sends it.
        self.profiled = profiled
        self.pending: list = []

    def run(self, mode, reqs, extend=None, decoding=0):
        """One forward batch of ``reqs``; ``extend``: each one's (chunk, prefix) in an extend
        batch, a mixed batch's ``decoding`` requests last (one token each)."""
        lc = plugin.lifecycles
        for r in reqs:
            if r in self.sched.waiting_queue:
                self.sched.waiting_queue.remove(r)
        batch = SimpleNamespace(
            forward_mode=mode,
            reqs=list(reqs),
            extend_lens=[c for c, _ in extend] if extend else None,
            prefix_lens=[p for _, p in extend] if extend else None,
            extend_num_tokens=sum(c for c, _ in extend) if extend else None,
            decoding_reqs=list(reqs[len(reqs) - decoding :]) if decoding else None,
            batch_size=lambda: len(reqs),
        )

        def forward(sched, b):
            if self.profiled is not None:
                self.profiled.forward_ct += 1
                self.profiled.manager._profile_batch_predicate(b)

        lc.around_run_batch(forward, self.sched, batch)
        # Where each request's computed tokens end: an extend chunk's end, or (decode) past
        # anything it holds.
        ends = [p + c for c, p in extend] if extend else [None] * len(reqs)
        self.pending.append((batch, ends))
        if not self.overlap or len(self.pending) > 1:
            self.process()

    def process(self):
        batch, ends = self.pending.pop(0)
        copy = SimpleNamespace(**{**vars(batch), "reqs": batch.reqs[:]})  # ScheduleBatch.copy()

        def result(sched, b, res):
            for r, end in zip(b.reqs, ends, strict=True):
                if r.finished():
                    continue
                if end is None or end >= r.seqlen:  # its prompt all computed
                    r.output_ids.append(7)
                    r.update_finish_state()

        plugin.lifecycles.around_process_result(result, self.sched, copy, None)

    def drain(self):
        while self.pending:
            self.process()


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_a_schedulers_request_log_follows_each_request_and_ctl_requests_reads_it(
    request_log, overlap
):
    """A long prompt in two chunks with a short request waiting behind its first, a decode,
    the short one retracted (SGLang's real ``_add_request_to_queue``, ``is_retracted``) and
    resumed: each request's steps, tokens, preemption and end (SGLang's own finish reason)
    as the log records them, in /server_info, and as `stepscope ctl requests --engine sglang`
    reads them; the same with SGLang's overlap loop (results one batch late)."""
    import sglang.srt.managers.scheduler as sm
    from sglang.srt.managers.io_struct import GetInternalStateReq, GetInternalStateReqOutput

    sched = sglang_queue()
    loop = Loop(sched, overlap=overlap)
    long, short = new_req("long", 300, 3), new_req("short", 8, 4)
    for r in (long, short):
        sm.Scheduler._add_request_to_queue(sched, r)  # SGLang's own, hooked
    assert sched.waiting_queue == [long, short]
    assert long.time_stats.wait_queue_entry_time > 0  # SGLang stamped its queue entry
    loop.run(P, [long], extend=[(256, 0)])  # 1: the long prompt's first chunk
    loop.run(P, [long, short], extend=[(44, 256), (8, 0)])  # 2: its last, the short prompt
    loop.run(D, [long, short])  # 3
    loop.run(I, [])  # an idle batch: no step, and no step's result taken by it
    sm.Scheduler._add_request_to_queue(sched, short, is_retracted=True)  # KV cache full
    loop.run(D, [long])  # 4: the long one's last token
    loop.run(P, [short], extend=[(short.seqlen, 0)])  # 5: recomputed
    loop.run(D, [short])  # 6
    loop.drain()
    assert long.finished() and short.finished()

    controller = SimpleNamespace(scheduler=SimpleNamespace(profiler_manager=None))
    out = plugin.hooks.after_internal_state(
        GetInternalStateReqOutput(internal_state={}), controller, GetInternalStateReq()
    )
    doc = out.internal_state["stepscope"]["requests"]
    steps = {s["step"]: s for s in doc["steps"]}
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]
    assert [(s["prefill_tokens"], s["decode_reqs"], s["waiting"]) for s in doc["steps"]] == [
        (256, 0, 1), (52, 0, 0), (0, 2, 0), (0, 1, 1), (10, 0, 0), (0, 1, 0),
    ]  # fmt: skip
    assert (steps[2]["largest_prefill_request"], steps[4]["preempted"]) == ("long", 1)
    r = {x["id"]: x for x in doc["requests"]}
    got = {k: r["long"][k] for k in ("prompt_tokens", "queued_after_step", "first_scheduled_step",
                                     "prefill_steps", "prefill_tokens", "first_token_step",
                                     "decode_steps", "output_tokens", "finish")}  # fmt: skip
    assert got == {"prompt_tokens": 300, "queued_after_step": 0, "first_scheduled_step": 1,
                   "prefill_steps": 2, "prefill_tokens": 300, "first_token_step": 2,
                   "decode_steps": 2, "output_tokens": 3, "finish": "length"}  # fmt: skip
    s = r["short"]
    assert (s["first_scheduled_step"], s["first_token_step"], s["output_tokens"]) == (2, 2, 4)
    assert (s["preempted_at"], s["resumed_at"], s["finish"]) == ([4], [5], "length")
    assert s["finished_step"] == 6 and r["long"]["finished_step"] == 4

    run = ctl_against_server_info(
        out.internal_state, "requests", "--engine", "sglang", "--by", "ttft", "--json"
    )
    assert run.returncode == 0, run.stderr
    read = json.loads(run.stdout)
    assert read["requests_seen"] == 2 and read["engines_without_log"] == 0
    by_id = {b["id"]: b for b in read["requests"]}
    assert (by_id["short"]["preempted_at"], by_id["long"]["preempted_at"]) == ([4], [])
    assert by_id["short"]["finish"] == by_id["long"]["finish"] == "length"
    # --since-step: what a read above step 4 sees (SGLang sends its last steps whatever).
    run = ctl_against_server_info(
        out.internal_state, "requests", "--engine", "sglang", "--since-step", "4", "--json"
    )
    assert run.returncode == 0, run.stderr
    assert [b["id"] for b in json.loads(run.stdout)["requests"]] == ["short"]


def test_a_request_refused_at_a_full_queue_ends_there_aborted(request_log):
    """SGLang's own queue limit (``max_queued_requests``) refuses a request in
    ``_add_request_to_queue``, answering the tokenizer with an abort: the log ends it there."""
    import sglang.srt.managers.scheduler as sm

    sched = sglang_queue()
    sent: list = []
    sched.max_queued_requests = 1
    sched.rust_server = None
    sched.ipc_channels = SimpleNamespace(
        send_to_tokenizer=SimpleNamespace(send_output=lambda out, req: sent.append(out))
    )
    sched.tree_cache = SimpleNamespace(finish=lambda handle, outcome: None)
    sm.Scheduler._add_request_to_queue(sched, new_req("in", 4, 1))
    sm.Scheduler._add_request_to_queue(sched, new_req("refused", 4, 1))
    assert [r.rid for r in sched.waiting_queue] == ["in"] and [a.rid for a in sent] == ["refused"]
    r = {x["id"]: x for x in json.loads(request_log.document_json())["requests"]}
    assert r["refused"]["finish"] == "abort" and r["in"]["finish"] is None


def test_without_the_key_no_scheduler_call_is_recorded_and_server_info_says_so(monkeypatch):
    monkeypatch.delenv("STEPSCOPE_CONFIG", raising=False)
    lc = plugin.lifecycles
    monkeypatch.setattr(lc, "_log", None)
    monkeypatch.setattr(lc, "_tried", False)
    assert lc.request_log() is None and lc.server_info_log() is None
    sched = sglang_queue()
    lc.around_add_request(lambda s, r, retracted: s.waiting_queue.append(r), sched,
                          new_req("x", 4, 1))  # fmt: skip
    assert len(sched.waiting_queue) == 1 and lc._in_flight == {}


def test_a_windows_request_log_is_on_disk_when_its_stop_returns_and_analyze_joins_it(
    request_log, tmp_path, monkeypatch
):
    """A capture with the log on writes ``{trace stem}.requests.json`` at its stop, before
    the stop returns; `stepscope analyze --requests` joins each captured request to it."""
    import sglang.srt.managers.scheduler as sm

    cli = built_cli()
    sched = sglang_queue()
    s = Scheduler()
    loop = Loop(sched, profiled=s)
    a, b = new_req("a", 40, 2), new_req("b", 20, 3)
    sm.Scheduler._add_request_to_queue(sched, a)
    loop.run(P, [a], extend=[(40, 0)])  # 1, before the window
    monkeypatch.setenv("STEPSCOPE_CONFIG", '{"stepscope": {"requests": true, "request_ids": true}}')
    assert s.profile(**profile_req(tmp_path, "logged")).success
    sm.Scheduler._add_request_to_queue(sched, b)
    loop.run(M, [b, a], extend=[(20, 0), (1, 40)], decoding=1)  # 2: b's prompt, a's decode
    loop.run(D, [b])  # 3: a ended in 2
    reply = s.stop()
    assert reply.success
    written = tmp_path / "logged-TP-0.requests.json"
    assert written.is_file(), list(tmp_path.iterdir())  # at once, not after the trace
    window = json.loads(written.read_text())
    assert [st["step"] for st in window["steps"]] == [2, 3]
    assert {r["id"] for r in window["requests"]} == {"a", "b"}
    m = wait_complete(tmp_path / "logged-TP-0.stepscope.json")
    (listed,) = analyze_requests(cli, tmp_path / m["trace_file"])["requests"]
    by_id = {r["id"]: r for r in listed["requests"]}
    assert sorted(by_id) == ["a", "b"]
    # Joined to the window's log: each request's lifecycle as the log recorded it.
    joined = by_id["b"]["log"]
    assert joined is not None, by_id["b"]
    assert (joined["prompt_tokens"], joined["output_tokens"]) == (20, 2)
    assert by_id["a"]["log"]["output_tokens"] == 2 and by_id["a"]["log"]["finish"] == "length"


def test_a_batchs_work_is_sglangs_own_detailed_annotation():
    """Each forward batch's work, summed by stepscope's core from the counts the plugin reads
    (extend_lens and prefix_lens, seq_lens_cpu in decode), equals what SGLang's own detailed
    step-span annotation computes for the same batch (``build_detailed_annotation_suffix`` on
    the ForwardBatch fields ``ForwardBatch.init_new`` copies from it)."""
    import re

    import torch
    from sglang.srt.model_executor.step_span_utils import build_detailed_annotation_suffix

    def sglangs(batch):
        forward = SimpleNamespace(
            forward_mode=batch.forward_mode,
            seq_lens_cpu=batch.seq_lens_cpu,
            extend_seq_lens_cpu=list(batch.extend_lens or []) or None,
            extend_prefix_lens_cpu=list(batch.prefix_lens or []) or None,
            spec_info=None,
        )
        text = build_detailed_annotation_suffix(forward)
        sums = {k: int(v) for k, v in re.findall(r"([cg]_s\w+)=(\d+)", text)}
        return {
            phase: {k: sums.get(f"{phase[0]}_{k}", 0) for k in ("sq", "sk", "sqsq", "sqsk")}
            for phase in ("context", "generation")
        }

    def ours(batch):
        name = plugin.iteration_of(batch, shares=True).name(detailed=True)
        m = re.fullmatch(
            r"execute_\d+_context_\d+\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
            r"_generation_\d+\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)",
            name,
        )
        assert m, name
        n = [int(x) for x in m.groups()]
        keys = ("sq", "sk", "sqsq", "sqsk")
        return {
            "context": dict(zip(keys, n[:4], strict=True)),
            "generation": dict(zip(keys, n[4:], strict=True)),
        }

    def reqs(n):
        return [SimpleNamespace(rid=str(i)) for i in range(n)]

    extend = SimpleNamespace(
        forward_mode=P, reqs=reqs(2), extend_num_tokens=300, extend_lens=[150, 150],
        prefix_lens=[0, 64], decoding_reqs=None, seq_lens_cpu=torch.tensor([150, 214]),
    )  # fmt: skip
    decode = SimpleNamespace(
        forward_mode=D, reqs=reqs(3), extend_lens=None, prefix_lens=None,
        seq_lens_cpu=torch.tensor([11, 21, 301]),
    )  # fmt: skip
    mixed = SimpleNamespace(
        forward_mode=M, reqs=reqs(3), extend_num_tokens=42, extend_lens=[40, 1, 1],
        prefix_lens=[128, 10, 20], decoding_reqs=None, seq_lens_cpu=torch.tensor([168, 11, 21]),
    )  # fmt: skip
    mixed.decoding_reqs = mixed.reqs[1:]
    for batch in (extend, decode, mixed):
        assert ours(batch) == sglangs(batch), batch.forward_mode
    assert ours(extend)["context"]["sk"] == 150 + 214
