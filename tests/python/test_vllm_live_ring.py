"""The request log with a ring smaller than the requests in flight, in a live `vllm serve`
(vLLM's CPU build): `{"requests": {"requests": 16, "steps": 16}}`, and 24 requests admitted at
once (one completion of 24 prompts: vLLM adds them to its engine together), five times from
concurrent clients. Every record `GET /stepscope/requests` returns either equals what its
client asked and got (its prompt, the 8 tokens it was given, `length`), or is marked partial
with what the log missed absent; `recorded` counts each of the 120 requests once; and
`stepscope ctl requests` says how many records are partial.
"""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from live_vllm import VllmServer, cpu_build_missing, slow_step_env
from test_vllm_live import stepscope_cli
from test_vllm_live_requests import ctl_requests

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

AT_ONCE = 24
ROUNDS = 5
OUTPUT = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm-live-ring")
    srv = VllmServer(
        workdir,
        {"profiler": "torch", "torch_profiler_dir": str(workdir / "traces")},
        # The endpoint plugin (VLLM_PLUGINS naming stepscope) serves /stepscope/requests.
        env=slow_step_env(
            STEPSCOPE_CONFIG=json.dumps({"stepscope": {"requests": {"requests": 16, "steps": 16}}})
        ),
        args=["--enforce-eager", "--max-num-seqs", str(AT_ONCE)],
    )
    try:
        yield srv.start()
    finally:
        srv.stop()


def test_a_ring_smaller_than_the_requests_in_flight_marks_what_it_lost(server):
    # Each request's prompt has its own length: the log's prompt names the request.
    lengths = {}
    errors = []

    def client(round_: int) -> None:
        prompts = []
        for k in range(AT_ONCE):
            n = 20 + round_ * AT_ONCE + k
            lengths[n] = round_
            prompts.append([3 + (n * 7 + j) % 500 for j in range(n)])
        try:
            status, answer, _ = server.post(
                "/v1/completions",
                {"model": str(server.model), "prompt": prompts, "max_tokens": OUTPUT,
                 "ignore_eos": True, "temperature": 0},
            )  # fmt: skip
            # The client's own usage: every prompt's tokens, and OUTPUT tokens each.
            usage = answer["usage"]
            assert status == 200, answer
            assert usage["prompt_tokens"] == sum(len(p) for p in prompts), usage
            assert usage["completion_tokens"] == AT_ONCE * OUTPUT, usage
            assert all(c["finish_reason"] == "length" for c in answer["choices"]), answer
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(r,)) for r in range(ROUNDS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

    status, answer, _ = server.get("/stepscope/requests?since=0")
    assert status == 200, answer
    (doc,) = answer["engines"]
    # 24 requests admitted together into a ring of 16: running ones were dropped.
    assert doc["evicted_running"] > 0, doc["evicted_running"]
    assert doc["recorded"]["requests"] == ROUNDS * AT_ONCE, doc["recorded"]
    partial = 0
    for r in doc["requests"]:
        if r.get("partial"):
            partial += 1
            # What the log missed is absent, not 0.
            assert (r["prompt_tokens"], r["cached_tokens"], r["output_tokens"]) == (
                None, None, None), r  # fmt: skip
        else:
            assert r["prompt_tokens"] in lengths, r
            if r["finish"] is not None:
                assert (r["output_tokens"], r["finish"]) == (OUTPUT, "length"), r
    assert partial > 0, doc["requests"]
    # `ctl requests` says how many records are partial, and shows their unknowns as such.
    table = ctl_requests(server, "--top", "0")
    listed = table["requests"]
    assert sum(1 for b in listed if b["partial"]) == partial, listed
    assert all(b["prompt_tokens"] is None for b in listed if b["partial"]), listed
    text = subprocess.run(
        [stepscope_cli(), "ctl", "requests", "--worker", f"http://127.0.0.1:{server.port}",
         "--top", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert f"{partial} of these requests are partial records" in text.stdout, text.stdout
