"""What exporting request spans (`"stepscope": {"otel": ...}`) costs, per request.

In process (the library as the plugins call it, release build):

- the engine's thread: vLLM's engine core answering the exporter's utility call (the batch
  handed to the builder's thread, a future returned), per request of a batch of 64; the API
  server's output loop handing a finished request over (`Exporter.offer`); SGLang's scheduler
  reading a request's trace context (`parent_of`) and handing it over;
- off it: building a batch's spans from the log and encoding them as OTLP protobuf
  (`RequestLog.spans_otlp`, 64 requests of 2-40 steps), then what Python does with the bytes
  (merged into the batch's message, serialized by the SDK's exporter), per request; beside it,
  what the SDK's own path would cost (its spans built, then encoded by its encoder).

With --live: a `vllm serve` of the token-cost model (tests/python/vllm_slow_step) with the
request log on, export off, then one with it on (its collector answering, then silent): the
median latency of the same sequential requests on each, and the ratios.

    .venv/bin/python scripts/bench_otel.py [--live]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import stepscope
from bench_requests import per_call_us  # the one timing loop of the Python benches
from stepscope import otel

BATCH = 64


def filled_log() -> tuple[stepscope.RequestLog, list[str]]:
    """A log of BATCH finished requests, interleaved as an engine serves them: each prefills
    in 1-2 chunks and decodes 1-38 steps, 8 at a time."""
    log = stepscope.RequestLog(requests=4096, steps=4096)
    ids = [f"cmpl-{k:04x}-0" for k in range(BATCH)]
    running: dict[str, int] = {}
    pending = list(ids)
    left = {rid: 1 + (k * 7) % 38 for k, rid in enumerate(ids)}
    while pending or running:
        while pending and len(running) < 8:
            rid = pending.pop(0)
            log.arrived(rid, 200)
            running[rid] = 0
        step = log.begin_step(len(pending))
        batch = list(running)
        tokens = [200 if running[r] == 0 else 1 for r in batch]
        log.scheduled(step, batch, tokens, [200 + running[r] if running[r] else 0 for r in batch],
                      outputs=[running[r] for r in batch])  # fmt: skip
        log.end_step(step)
        log.produced(step, batch, [1] * len(batch))
        for r in batch:
            running[r] += 1
            if running[r] > left[r]:
                log.finished(step, r, "length")
                del running[r]
    return log, ids


def in_process() -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    log, ids = filled_log()
    wanted = [(rid, "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331") for rid in ids]
    encoded, requests, spans, _, _ = log.spans_otlp(wanted, salt=1, protobuf=True)
    assert requests == BATCH
    build = per_call_us(lambda: log.spans_otlp(wanted, salt=1, protobuf=True)) / BATCH
    build_steps = per_call_us(
        lambda: log.spans_otlp(wanted, salt=1, steps_after=-1, protobuf=True)) / BATCH  # fmt: skip
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def merged():
        m = ExportTraceServiceRequest()
        m.MergeFromString(encoded)
        return m.SerializePartialToString()

    # What the exporter's thread does with it in Python: merged into the batch's message,
    # which the SDK's exporter serializes.
    python_side = per_call_us(merged) / BATCH
    size = len(encoded) / BATCH
    # Had the SDK's spans been handed over (the path of an exporter that encodes itself).
    message = ExportTraceServiceRequest.FromString(encoded)
    convert = per_call_us(lambda: otel.readable_spans(message)) / BATCH
    readable = otel.readable_spans(message)
    encode = per_call_us(lambda: encode_spans(readable).SerializeToString()) / BATCH

    # The engine's thread: the engine core's utility call hands the batch over.
    from stepscope.vllm import lifecycles

    builder = lifecycles._SpanThread()
    builder.build = lambda *a: None  # the hand-over alone: the build is timed above
    lifecycles._span_thread = builder

    lifecycles._log, lifecycles._tried = log, True
    lifecycles.requests_wanted = lambda: True
    lists = [list(w) for w in wanted]
    # The engine's thread only submits (it never waits on the future: vLLM answers when done).
    hand_over = per_call_us(lambda: lifecycles.engine_request_spans(None, lists, 1)) / BATCH

    # The API server's output loop, and SGLang's scheduler: a finished request handed over.
    exporter = otel.Exporter.__new__(otel.Exporter)
    import queue

    exporter.queue = queue.Queue(maxsize=1 << 30)
    exporter.offered = exporter.dropped = 0
    offer = per_call_us(lambda: exporter.offer("cmpl-0001-0", "0af7", "b7ad"))
    print_rows(build, build_steps, python_side, size, convert, encode, hand_over, offer)


def sglang_parent_us() -> float | None:
    try:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        from stepscope.sglang.otel import parent_of
    except ImportError:
        return None
    root = NonRecordingSpan(SpanContext(1 << 80, 1 << 40, True, TraceFlags(1)))
    ctx = trace.set_span_in_context(root)
    req = SimpleNamespace(time_stats=SimpleNamespace(trace_ctx=SimpleNamespace(
        tracing_enable=True, root_span_context=ctx)))  # fmt: skip
    return per_call_us(lambda: parent_of(req))


def print_rows(build, build_steps, python_side, size, convert, encode, hand_over, offer) -> None:
    print(f"request spans, per request (batches of {BATCH}; stepscope {stepscope.__version__})")
    print("  off the engine's thread:")
    print(f"    build and encode (RequestLog.spans_otlp)      {build:7.2f} µs ({size:.0f} bytes)")
    print(f"    the same, with the step spans                 {build_steps:7.2f} µs")
    print(f"    in Python: merged, serialized by the exporter {python_side:7.2f} µs")
    print(f"    total                                         {build + python_side:7.2f} µs")
    print("  had the SDK's spans been handed over instead:")
    print(f"    to the SDK's spans (readable_spans)           {convert:7.2f} µs")
    print(f"    the SDK's OTLP encoding                       {encode:7.2f} µs")
    print("  on the engine's threads:")
    print(f"    vLLM engine core: the batch handed over       {hand_over:7.2f} µs")
    print(f"    vLLM API server: Exporter.offer               {offer:7.2f} µs")
    parent = sglang_parent_us()
    if parent is not None:
        print(f"    SGLang scheduler: parent_of + offer           {parent + offer:7.2f} µs")


def live() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/python"))
    from otlp_receiver import OtlpReceiver
    from test_vllm_live_requests import prompt, token_cost_server

    def latencies(server, n: int = 40) -> list[float]:
        out = []
        for k in range(n):
            _, seconds = server.completion_of(prompt(24, 5000 + k), 8)
            out.append(seconds * 1e3)
        return out

    results = {}
    for name in ("off", "on"):
        # Counting, not decoding: the collector's own work stays off this machine's cores.
        receiver = OtlpReceiver(decoding=False)
        workdir = Path(tempfile.mkdtemp(prefix=f"stepscope-bench-otel-{name}-"))
        keys = {"otel": {"endpoint": receiver.url}} if name == "on" else {}
        server = token_cost_server(workdir, keys=keys, env={
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "900"})  # fmt: skip
        server.start()
        try:
            latencies(server, 8)  # warm-up
            results[name] = latencies(server)
            if name == "on":
                status = server.get("/stepscope/status")[1]["otel"]
                results["exported"] = status["exported_requests"]
                receiver.silent()
                results["silent"] = latencies(server)
                results["silent_status"] = server.get("/stepscope/status")[1]["otel"]
        finally:
            receiver.answer_again()
            server.stop()
            receiver.close()
    med = {k: statistics.median(results[k]) for k in ("off", "on", "silent")}
    print("live vllm serve (TokenCostLlama, 24-token prompts, 8 tokens, one at a time, 40 each)")
    for k in ("off", "on", "silent"):
        print(f"  export {k:<7} median {med[k]:7.2f} ms  ({med[k] / med['off']:.3f}x off)")
    s = results["silent_status"]
    print(f"  answering: {results['exported']} requests exported; silent: queued {s['queued']}/"
          f"{s['queue']}, dropped {s['dropped']}, in flight {s['in_flight']}")  # fmt: skip
    print(json.dumps({k: results[k] for k in ("off", "on", "silent")}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--live", action="store_true", help="also time a live vllm serve (3-5 min)")
    args = ap.parse_args()
    in_process()
    if args.live:
        live()


if __name__ == "__main__":
    main()
