"""vLLM's WorkerProfiler cases through the Python API, on the CUDA backend: every driver call
lands in the stub libcuda.so and every NVTX event in the injection recorder (conftest.py)."""

from __future__ import annotations

CUDA = '{"profiler": "cuda"%s}'


def cfg(extra: str = "") -> str:
    return CUDA % (", " + extra if extra else "")


def test_immediate_start_and_stop(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg()!r}, "w0")
        p.start()
        RESULT["after_start"] = [p.is_active, p.is_running]
        RESULT["captured"] = engine(p, 3)
        p.stop()
        RESULT["after_stop"] = [p.is_active, p.is_running]
        """
    )
    assert r.result["after_start"] == [True, True]
    assert r.result["captured"] == [True, True, True]
    assert r.result["after_stop"] == [False, False]
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")]


def test_delayed_start_begins_in_the_step_that_reaches_the_delay(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg('"delay_iterations": 3')!r}, "w0")
        p.start()
        RESULT["after_start"] = [p.is_active, p.is_running, p.phase]
        RESULT["captured"] = engine(p, 5)
        """
    )
    assert r.result["after_start"] == [True, False, "delaying"]
    assert r.result["captured"] == [False, False, True, True, True]
    # Still running when the script ends: stopped at interpreter exit (stepscope's atexit).
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")]


def test_max_iterations_stop_after_more_than_max_with_a_full_reset(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg('"max_iterations": 2')!r}, "w0")
        p.start()
        RESULT["captured"] = engine(p, 4)
        RESULT["after"] = [p.is_active, p.is_running]
        p.start()  # not ignored: the auto-stop reset the session
        RESULT["restarted"] = [p.is_active, p.is_running]
        RESULT["again"] = engine(p, 4)
        """
    )
    # vLLM: the stop comes in the step whose count exceeds max (> N).
    assert r.result["captured"] == [True, True, False, False]
    assert r.result["after"] == [False, False]
    assert r.result["restarted"] == [True, True]
    assert r.result["again"] == [True, True, False, False]
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")] * 2


def test_delay_and_max_capture_exactly_the_window_with_counts_in_nvtx(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg('"delay_iterations": 2, "max_iterations": 3')!r}, "w0")
        p.start()
        RESULT["captured"] = engine(p, 7, lambda i: stepscope.Iteration(1, 100 + i, i, i))
        RESULT["tid"] = threading.get_native_id()
        """
    )
    assert r.result["captured"] == [False, True, True, True, False, False, False]
    starts = [i for i, e in enumerate(r.events) if e.name == "cuProfilerStart"]
    stops = [i for i, e in enumerate(r.events) if e.name == "cuProfilerStop"]
    assert len(starts) == len(stops) == 1
    inside = r.events[starts[0] : stops[0]]
    pushes = [(e.arg(0), e.arg(1), e.arg(2)) for e in inside if e.name == "push"]
    # (domain, vLLM's name, payload = the step index)
    assert pushes == [
        ("stepscope", f"execute_context_1({100 + i})_generation_{i}({i})", str(i)) for i in (2, 3, 4)
    ]
    assert len([e for e in inside if e.name == "pop"]) == 3
    assert not [e for e in r.events if e.name == "push" and e not in inside]
    driver_threads = {e.tid for e in r.events if e.source == "cuda"}
    assert driver_threads == {r.result["tid"]}


def test_duplicate_start_and_stop_are_ignored(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg()!r}, "w0")
        p.start(); p.start()
        engine(p, 2)
        p.stop(); p.stop()
        RESULT["active"] = p.is_active
        """
    )
    assert r.result["active"] is False
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")]


def test_stop_during_the_delay_never_touches_the_driver(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg('"delay_iterations": 5')!r}, "w0")
        p.start()
        engine(p, 2)
        p.stop()
        RESULT["captured"] = engine(p, 6)
        """
    )
    assert r.result["captured"] == [False] * 6
    assert r.driver() == []


def test_session_overrides_apply_once_and_revert_at_the_next_start(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg('"delay_iterations": 2, "max_iterations": 1')!r}, "w0")
        p.start(delay_iterations=0, max_iterations=3)
        RESULT["first"] = engine(p, 5)
        p.start()
        RESULT["second"] = engine(p, 5)
        """
    )
    assert r.result["first"] == [True, True, True, False, False]
    assert r.result["second"] == [False, True, False, False, False]


def test_a_failed_start_is_logged_not_raised_and_the_session_stays_active(engine_script):
    r = engine_script(
        f"""
        import logging
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append((record.name, record.levelname, record.getMessage()))
        logging.getLogger("stepscope").addHandler(Keep())
        p = stepscope.WorkerProfiler({cfg()!r}, "w0")
        p.start()  # the stub fails cuProfilerStart (STEPSCOPE_STUB_CUDA_FAIL)
        RESULT["after_start"] = [p.is_active, p.is_running, p.phase]
        RESULT["captured"] = engine(p, 2)
        p.start()  # ignored: still active
        p.stop()
        RESULT["after_stop"] = [p.is_active, p.is_running]
        os.environ.pop("STEPSCOPE_STUB_CUDA_FAIL")
        p.start()
        RESULT["retry"] = [p.is_active, p.is_running]
        RESULT["records"] = records
        """,
        env={"STEPSCOPE_STUB_CUDA_FAIL": "cuProfilerStart:2"},
    )
    assert r.result["after_start"] == [True, False, "start_failed"]
    assert r.result["captured"] == [False, False]
    assert r.result["after_stop"] == [False, False]
    assert r.result["retry"] == [True, True]
    # One failed call (no retries), no stop for a session that never ran, then the retry
    # (stopped at interpreter exit).
    assert r.driver() == [
        ("cuProfilerStart", "2"),
        ("cuProfilerStart", "0"),
        ("cuProfilerStop", "0"),
    ]
    warnings = [rec for rec in r.result["records"] if rec[1] == "WARNING"]
    assert len(warnings) == 1, r.result["records"]
    name, _, message = warnings[0]
    assert name.startswith("stepscope")
    assert "cuProfilerStart failed" in message and "2" in message


def test_a_delayed_start_failure_comes_from_step_and_is_not_retried(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg('"delay_iterations": 2')!r}, "w0")
        p.start()
        RESULT["captured"] = engine(p, 5)
        RESULT["phase"] = p.phase
        """,
        env={"STEPSCOPE_STUB_CUDA_FAIL": "cuProfilerStart"},
    )
    assert r.result["captured"] == [False] * 5
    assert r.result["phase"] == "start_failed"
    assert r.driver() == [("cuProfilerStart", "999")]


def test_a_failed_stop_is_logged_and_the_session_still_ends(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg()!r}, "w0")
        p.start()
        engine(p, 2)
        p.stop()
        RESULT["after"] = [p.is_active, p.is_running]
        """,
        env={"STEPSCOPE_STUB_CUDA_FAIL": "cuProfilerStop"},
    )
    assert r.result["after"] == [False, False]
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "999")]


def test_shutdown_stops_only_a_running_session(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg('"delay_iterations": 5')!r}, "w0")
        p.start()
        engine(p, 1)
        p.shutdown()
        RESULT["delaying"] = [p.is_active, p.is_running]
        p.stop()
        p.start(delay_iterations=0)
        engine(p, 1)
        p.shutdown()
        RESULT["running"] = [p.is_active, p.is_running]
        """
    )
    assert r.result["delaying"] == [True, False]  # vLLM: shutdown() stops only when running
    assert r.result["running"] == [False, False]
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")]


def test_a_start_from_another_thread_reaches_the_driver_on_the_engine_thread(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg('"max_iterations": 2')!r}, "w0")
        engine(p, 1)  # the engine thread is known from its first step
        t = threading.Thread(target=p.start); t.start(); t.join()
        RESULT["deferred"] = [p.is_active, p.is_running]
        RESULT["captured"] = engine(p, 4)
        RESULT["tid"] = threading.get_native_id()
        """
    )
    assert r.result["deferred"][0] is True
    assert r.result["captured"] == [True, True, False, False]
    assert {e.tid for e in r.events if e.source == "cuda" and e.name.startswith("cuProfiler")} == {
        r.result["tid"]
    }


def test_a_stop_from_another_thread_is_running_until_the_driver_has_stopped(engine_script):
    """The stub driver's log is the truth: while cuProfilerStart has no cuProfilerStop yet,
    the profiler says it runs (``is_running``, ``status()["running"]``, ``"stopping"``)."""
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg()!r}, "w0")
        engine(p, 1)
        p.start()
        t = threading.Thread(target=p.stop); t.start(); t.join()
        s = p.status()
        RESULT["pending"] = [p.is_active, p.is_running, s["running"], s["stopping"]]
        # The doubles' log, in the child's working directory.
        RESULT["calls_then"] = [l for l in open("doubles.log") if "cuProfiler" in l]
        engine(p, 1)
        s = p.status()
        RESULT["after_step"] = [p.is_active, p.is_running, s["running"], s["stopping"]]
        """
    )
    assert r.result["pending"] == [False, True, True, True]
    assert len(r.result["calls_then"]) == 1 and "cuProfilerStart" in r.result["calls_then"][0]
    assert r.result["after_step"] == [False, False, False, False]
    assert r.driver() == [("cuProfilerStart", "0"), ("cuProfilerStop", "0")]


def test_set_output_name_refuses_what_is_no_file_name(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg()!r}, "w0")
        try:
            p.set_output_name("../x")
        except ValueError as e:
            RESULT["error"] = str(e)
        RESULT["name"] = p.worker_name
        """
    )
    assert "worker_name" in r.result["error"] and "../x" in r.result["error"]
    assert r.result["name"] == "w0"


def test_set_output_name_is_ignored_while_a_session_is_active(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg()!r}, "w0")
        p.set_output_name("before")
        p.start()
        p.set_output_name("during")
        RESULT["names"] = [p.worker_name]
        p.stop()
        p.set_output_name("after")
        RESULT["names"].append(p.worker_name)
        """
    )
    assert r.result["names"] == ["before", "after"]


def test_without_a_driver_start_is_logged_and_the_engine_goes_on(engine_script):
    r = engine_script(
        f"""
        p = stepscope.WorkerProfiler({cfg()!r}, "w0")
        p.start()
        RESULT["captured"] = engine(p, 3)
        RESULT["phase"] = p.phase
        """,
        driver=False,
    )
    assert r.result["captured"] == [False] * 3
    assert r.result["phase"] == "start_failed"
    assert "libcuda" in r.stderr or "CUDA driver" in r.stderr
