"""The Python surface itself: config forms, errors that name what is wrong, Iteration."""

from __future__ import annotations

import json
import pathlib
import time

import pytest

import stepscope


def test_config_as_dict_json_text_or_path_gives_the_same_profiler(tmp_path):
    cfg = {"delay_iterations": 2, "max_iterations": 3, "stepscope": {"nvtx": "off"}}
    path = tmp_path / "profiler.json"
    path.write_text(json.dumps(cfg))
    forms = [cfg, json.dumps(cfg), str(path), pathlib.Path(path)]
    configs = {stepscope.WorkerProfiler(f, "w").config_json for f in forms}
    assert len(configs) == 1
    parsed = json.loads(configs.pop())
    assert (parsed["delay_iterations"], parsed["max_iterations"]) == (2, 3)
    assert parsed["stepscope"]["nvtx"] == "off"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"max_iterations": -1}, "max_iterations"),
        ({"delay_iterations": "3"}, "delay_iterations"),
        ({"profiler": "nsys"}, "profiler"),
        ({"torch_profiler_activities": ["TPU"]}, "torch_profiler_activities"),
        ({"delay_iteration": 3}, "delay_iteration"),
        ({"stepscope": {"nvtx": "sometimes"}}, "stepscope.nvtx"),
        ({"profiler": "torch"}, "torch_profiler_dir"),
    ],
)
def test_a_bad_config_raises_config_error_naming_the_field(config, field):
    with pytest.raises(stepscope.ConfigError) as info:
        stepscope.WorkerProfiler(config, "w")
    assert isinstance(info.value, ValueError)
    assert field in str(info.value)
    assert info.value.field == field


def test_malformed_json_and_missing_files_name_their_source(tmp_path):
    with pytest.raises(stepscope.ConfigError, match="line 1"):
        stepscope.WorkerProfiler('{"max_iterations": ', "w")
    missing = tmp_path / "nope.json"
    with pytest.raises(OSError, match="nope.json"):
        stepscope.WorkerProfiler(str(missing), "w")
    with pytest.raises(TypeError, match="int"):
        stepscope.WorkerProfiler(42, "w")  # type: ignore[arg-type]
    with pytest.raises(stepscope.ConfigError, match="JSON-serializable"):
        stepscope.WorkerProfiler({"delay_iterations": object()}, "w")


def test_negative_overrides_raise_value_error_naming_them():
    p = stepscope.WorkerProfiler({}, "w")
    with pytest.raises(ValueError, match="delay_iterations"):
        p.start(delay_iterations=-1)
    with pytest.raises(ValueError, match="max_iterations"):
        p.start(max_iterations=-2)
    assert not p.is_active, "a rejected start starts nothing"
    with pytest.raises(TypeError):
        p.start(3)  # type: ignore[misc]  # keyword-only, as vLLM's
    with pytest.raises(ValueError, match="local_rank"):
        stepscope.WorkerProfiler({}, "w", local_rank=-1)
    with pytest.raises(ValueError, match="timeout"):
        p.flush(-1.0)


def test_without_a_backend_the_schedule_still_runs():
    p = stepscope.WorkerProfiler({"delay_iterations": 2, "max_iterations": 2}, "w")
    assert (p.is_armed, p.phase) == (False, "idle")
    p.start()
    assert p.is_armed
    seen = []
    for _ in range(5):
        p.step()
        seen.append(p.phase)
    assert seen == ["delaying", "running", "running", "idle", "idle"]
    assert p.step_index == 5
    assert p.flush(0.0) is True
    assert (p.has_cuda_graph_session, p.pending_writes) == (False, 0)
    with p.capture_cuda_graphs():
        pass


def test_iteration_names_are_vllms():
    it = stepscope.Iteration(1, 512, 31, 31)
    assert it.name() == "execute_context_1(512)_generation_31(31)"
    assert it.stage == "mixed"
    assert (it.num_ctx_reqs, it.num_ctx_tokens, it.num_gen_reqs, it.num_gen_tokens) == (1, 512, 31, 31)
    detailed = stepscope.Iteration(
        1, 4, 2, 2,
        ctx_seq_len_sum=4, ctx_qq_compute=16, ctx_qk_compute=16,
        gen_seq_len_sum=20, gen_qq_compute=2, gen_qk_compute=20,
    )
    assert detailed.name(detailed=True) == (
        "execute_6_context_1(sq4sk4sqsq16sqsk16)_generation_2(sq2sk20sqsq2sqsk20)"
    )
    assert detailed.name() == "execute_context_1(4)_generation_2(2)"
    assert stepscope.Iteration() == stepscope.Iteration(0, 0, 0, 0)
    assert stepscope.Iteration().stage == "idle"
    with pytest.raises(ValueError, match="num_gen_tokens"):
        stepscope.Iteration(0, 0, 0, -1)
    with pytest.raises(ValueError, match="ctx_qq_compute"):
        stepscope.Iteration(ctx_qq_compute=-5)
    # The sums from each request's counts; for no request (a step that scheduled nothing)
    # zeros, as vLLM names it; computed tokens alone are refused, not taken as no request.
    shared = stepscope.Iteration(1, 4, 0, 0, request_tokens=[4], request_prefill=[True],
                                 request_computed=[0])  # fmt: skip
    assert shared.name(detailed=True).startswith("execute_4_context_1(sq4sk4sqsq16sqsk16)")
    empty = stepscope.Iteration(request_tokens=[], request_prefill=[], request_computed=[])
    assert empty.name(detailed=True) == (
        "execute_0_context_0(sq0sk0sqsq0sqsk0)_generation_0(sq0sk0sqsq0sqsk0)"
    )
    with pytest.raises(ValueError, match="request_computed goes with request_tokens"):
        stepscope.Iteration(1, 512, 0, 0, request_computed=[0])


def test_the_package_ships_its_typing_and_version():
    root = pathlib.Path(stepscope.__file__).parent
    assert (root / "py.typed").exists()
    assert (root / "_native.pyi").exists()
    assert stepscope.__version__.count(".") == 2


def test_the_request_log_records_a_lifecycle_and_names_bad_arguments():
    # Its default sizes are the config's `true`.
    log = stepscope.RequestLog()
    assert log.capacity == stepscope.RequestLog.from_config({"stepscope": {"requests": True}}).capacity
    assert stepscope.RequestLog.from_config({"stepscope": {}}) is None
    with pytest.raises(stepscope.ConfigError) as e:
        stepscope.RequestLog.from_config({"stepscope": {"requests": {"steps": 1}}})
    assert e.value.field == "stepscope.requests.steps"
    log = stepscope.RequestLog(requests=16, steps=16)
    log.arrived("a", 3, time.time() - 0.002)
    step = log.begin_step(5)
    log.scheduled(step, ["a"], [3], [0])
    log.end_step(step)
    log.produced(step, ["a"], [1])
    log.finished(step, "a", "LENGTH")
    doc = json.loads(log.document_json())
    (r,) = doc["requests"]
    assert (r["id"], r["prompt_tokens"], r["prefill_steps"], r["first_token_step"]) == ("a", 3, 1, 1)
    assert r["finish"] == "length" and doc["steps"][0]["waiting"] == 5
    # It arrived 2 ms before it was queued (its own clock and the wall clock, read together).
    assert r["queued_unix_ns"] - r["arrival_unix_ns"] >= 2_000_000
    # The engine's roles over the log's inference: "b" decodes before its first token is in
    # (an overlap loop); without them, it would count as prefill.
    step = log.begin_step()
    log.scheduled(step, ["b", "c"], [1, 1], [4, 4], prefill=[False, True])
    (b, c) = json.loads(log.document_json(step - 1))["requests"][-2:]
    assert (b["decode_steps"], b["prefill_steps"], c["prefill_steps"]) == (1, 0, 1)
    for bad in (lambda: log.scheduled(step, ["a", "b"], [1], [0, 0]),
                lambda: log.scheduled(step, [1], [1], [0]),
                lambda: log.scheduled(step, ["a"], [1], [0], prefill=[True, False]),
                lambda: log.scheduled(step, ["a"], [1], [0], prefill=["yes"]),
                lambda: log.produced(step, ["a"], [-1])):  # fmt: skip
        with pytest.raises(ValueError):
            bad()
