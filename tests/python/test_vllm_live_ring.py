"""The request log with a ring smaller than the requests in flight, in a live `vllm serve`
(vLLM's CPU build): `{"requests": {"requests": 16, "steps": 16}}`, and 24 requests admitted at
once (one completion of 24 prompts: vLLM adds them to its engine together), five times from
concurrent clients, on the slow-step trigger's server (no profile started here; what that
module's test sent before is counted out). Every record `GET /stepscope/requests` returns
either equals what its client asked and got (its prompt, the 8 tokens it was given, `length`),
or is marked partial with what the log missed absent; `recorded` counts each of the 120
requests once; and `stepscope ctl requests` says how many records are partial.
"""

from __future__ import annotations

import subprocess
import threading

import pytest

from live_vllm import cpu_build_missing
from test_vllm_live import stepscope_cli
from test_vllm_live_requests import ctl_requests

pytestmark = pytest.mark.skipif(cpu_build_missing() is not None, reason=str(cpu_build_missing()))

#: The request log's room, for requests and for steps alike: fewer than AT_ONCE.
RING = 16
AT_ONCE = 24
ROUNDS = 5
OUTPUT = 8


@pytest.fixture(scope="module")
def server(slow_step_live):
    """The slow-step trigger's server (test_vllm_live_trigger.shared_server), its request log
    a ring of RING requests and RING steps, AT_ONCE requests admitted at once."""
    return slow_step_live


def test_a_ring_smaller_than_the_requests_in_flight_marks_what_it_lost(server):
    # The server's counts so far (the trigger's test may have run on it first).
    status, answer, _ = server.get("/stepscope/requests?since=0")
    assert status == 200, answer
    (before,) = answer["engines"]
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
    assert doc["evicted_running"] > before["evicted_running"], (doc, before)
    assert doc["recorded"]["requests"] - before["recorded"]["requests"] == ROUNDS * AT_ONCE, (
        doc["recorded"], before["recorded"])  # fmt: skip
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
