"""stepscope on a real GPU: the one command run on a GPU machine, with the wheel installed (and
the C library and the toy engine's sources in the tree). Prints one JSON object per check and
writes traces and reports under OUT_DIR; exit status 1 if any check failed.

    python scripts/gpu_check.py OUT_DIR          # every check
    python scripts/gpu_check.py --loop-cuda      # the cuda-backend loop NVIDIA's tools run

Checks (docs/gpu.md has what each one found):

1. The torch backend, default activities: a window of matmul iterations; the trace read back
   (CUPTI's kernels, the iteration annotations, the manifest and op table).
2. stop() and time to disk against torch.profiler's own stop + export of the same work.
3. Request shares of CUPTI kernel time (`stepscope analyze --requests`).
4. The cuda backend (cuProfilerStart/Stop) on the real driver.
5. CUDA graphs as vLLM decodes: a two-layer Llama-shaped model in bf16 whose decode steps
   replay a `torch.cuda.CUDAGraph` and whose prefill steps run eager, one step in flight (no
   synchronize per step), a window in the middle; `stepscope analyze` against the raw trace:
   every replay's kernels in the step that launched it, as many as the graph's kernel nodes,
   nothing outside the window; what Kineto gives a graph kernel; each step's floor against the
   same figure computed from the model's tensors and the step's kernels alone.
6. Kernel to op inside graph replays: the capture traced as vLLM's `capture_torch_profiler`
   does, an eager decode traced, and the replay's kernels in order against both; then one graph
   per batch size captured in one trace, as vLLM captures them, replayed in turn.
7. NVIDIA's tools: a C toy engine (scripts/gpu_toy.cu) and the Python loop under
   `ncu --profile-from-start off` and `ncu --nvtx --nvtx-include`, and `nsys` with
   `--capture-range=cudaProfilerApi` where one is found.
8. Overhead: step() idle / timeline on / running from Python, the Rust step bench if carried;
   a decode step captured by stepscope against torch.profiler; stop to disk for both.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

import stepscope

ITERS = 12
DELAY, MAX = 3, 5


def work(x: torch.Tensor) -> torch.Tensor:
    for _ in range(20):
        x = torch.relu(x @ x) / x.shape[0]
    return x


def engine(p: stepscope.WorkerProfiler, x: torch.Tensor) -> None:
    for i in range(1, ITERS + 1):
        p.step(stepscope.Iteration(i, 16 * i, 32, 32))
        x = work(x)
        torch.cuda.synchronize()
        p.step_end()


def torch_backend(out: Path) -> dict:
    d = out / "torch"
    p = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": str(d), "delay_iterations": DELAY,
         "max_iterations": MAX, "torch_profiler_with_stack": True},
        "gpu_rank0",
    )
    x = torch.randn(1024, 1024, device="cuda")
    work(x)
    torch.cuda.synchronize()
    p.start()
    engine(p, x)
    t0 = time.perf_counter()
    p.stop()  # the window already ended by itself; a no-op here
    stop_s = time.perf_counter() - t0
    ok_flush = p.flush(300)
    (manifest_path,) = d.glob("*.stepscope.json")
    manifest = json.loads(manifest_path.read_text())
    trace = d / manifest["trace_file"]
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    cats: dict[str, int] = {}
    for e in events:
        cats[e.get("cat", "?")] = cats.get(e.get("cat", "?"), 0) + 1
    kernels = [e for e in events if e.get("cat") == "kernel"]
    gpu_ann = sorted({e["name"] for e in events if e.get("cat") == "gpu_user_annotation"})
    cpu_ann = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    table = (d / "gpu_rank0.profiler_out.txt")
    return {
        "check": "torch backend, CUDA activity",
        "glue": stepscope.kineto_glue(),
        "flushed": ok_flush,
        "status": manifest["status"],
        "iterations": manifest["iterations"],
        "first_step": manifest["first_step"],
        "writer_seconds": manifest["writer_seconds"],
        "json_bytes": manifest["json_bytes"],
        "trace_bytes": manifest["trace_bytes"],
        "kernels": len(kernels),
        "kernel_names": sorted({k["name"] for k in kernels})[:3],
        "devices": sorted({k.get("args", {}).get("device") for k in kernels}, key=str),
        "cpu_annotations": cpu_ann,
        "gpu_annotations": gpu_ann,
        "categories": cats,
        "header_keys": sorted(k for k in doc if k != "traceEvents"),
        "op_table_head": table.read_text().splitlines()[:4] if table.exists() else None,
        "stop_s": stop_s,
        "ok": manifest["status"] == "complete" and len(kernels) > 0 and len(cpu_ann) == MAX,
    }


def stop_latency(out: Path) -> dict:
    """A manual stop in the middle of a capture: what the engine thread pays, and the time to
    the trace on disk; then torch.profiler's own stop + export of the same work."""
    d = out / "stop"
    x = torch.randn(1024, 1024, device="cuda")
    p = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": str(d), "torch_profiler_with_stack": True},
        "stop_rank0",
    )
    p.start()
    for _ in range(8):
        p.step(stepscope.Iteration(0, 0, 32, 32))
        x = work(x)
        p.step_end()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    p.stop()
    ours_stop = time.perf_counter() - t0
    p.flush(300)
    ours_disk = time.perf_counter() - t0
    (m,) = d.glob("*.stepscope.json")
    ours = json.loads(m.read_text())

    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        with_stack=True,
    )
    prof.start()
    for _ in range(8):
        with torch.profiler.record_function("iteration"):
            x = work(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    prof.stop()
    theirs_stop = time.perf_counter() - t0
    path = out / "torch_own.pt.trace.json.gz"
    prof.export_chrome_trace(str(path))
    theirs_disk = time.perf_counter() - t0
    return {
        "check": "stop latency and time to disk, 8 iterations x 20 matmuls, with_stack",
        "stepscope_stop_s": ours_stop,
        "stepscope_on_disk_s": ours_disk,
        "stepscope_json_bytes": ours["json_bytes"],
        "torch_stop_s": theirs_stop,
        "torch_stop_plus_export_s": theirs_disk,
        "torch_gz_bytes": path.stat().st_size,
        "stop_ratio": theirs_stop / max(ours_stop, 1e-9),
        "ok": ours["status"] == "complete",
    }


def cuda_backend() -> dict:
    p = stepscope.WorkerProfiler({"profiler": "cuda", "delay_iterations": 1, "max_iterations": 3}, "cuda0")
    x = torch.randn(512, 512, device="cuda")
    p.start()
    running = []
    for _ in range(6):
        p.step(stepscope.Iteration(0, 0, 8, 8))
        running.append(p.is_running)
        x = work(x)
        p.step_end()
    torch.cuda.synchronize()
    st = p.status()
    # With NVTX_INJECTION64_PATH at tests/doubles' recorder (nsys's place), what NVTX saw.
    log = os.environ.get("STEPSCOPE_DOUBLES_LOG")
    nvtx = []
    if log and os.path.exists(log):
        nvtx = [line.split("\t", 3)[2:] for line in Path(log).read_text().splitlines()
                if line.startswith("nvtx") and ("\tpush\t" in line or "\tmark\t" in line)]
    return {
        "nvtx_recorded": nvtx,
        "check": "cuda backend (cuProfilerStart/Stop, real driver)",
        "running_per_step": running,
        "phase": st["phase"],
        "iterations_captured": st["iterations_captured"],
        "last_error": st["last_error"],
        "ok": st["last_error"] is None and st["iterations_captured"] == 3,
    }


def request_shares(out: Path) -> dict:
    """Each request's share of the captured iterations' GPU kernel time, by its tokens, as
    `stepscope analyze --requests` (the wheel's own command) reads it from CUPTI's kernels."""
    d = out / "requests"
    p = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": str(d), "max_iterations": 4,
         "torch_profiler_with_stack": False, "stepscope": {"request_ids": True}},
        "req_rank0",
    )
    x = torch.randn(1024, 1024, device="cuda")
    work(x)
    torch.cuda.synchronize()
    # (ids, tokens, in prefill): a's and b's prompts, then c's beside their decodes.
    plan = [
        (["a", "b"], [96, 32], [True, True]),
        (["a", "b", "c"], [1, 1, 64], [False, False, True]),
        (["a", "b", "c"], [1, 1, 1], [False, False, False]),
        (["b", "c"], [1, 1], [False, False]),
    ]
    p.start()
    for ids, tokens, prefill in plan:
        ctx = [t for t, f in zip(tokens, prefill, strict=True) if f]
        gen = [t for t, f in zip(tokens, prefill, strict=True) if not f]
        p.step(stepscope.Iteration(len(ctx), sum(ctx), len(gen), sum(gen), request_ids=ids,
                                   request_tokens=tokens, request_prefill=prefill))
        x = work(x)
        torch.cuda.synchronize()
        p.step_end()
    p.stop()  # the window's 4 iterations are done; it would end at the next step()
    p.flush(300)
    (manifest_path,) = d.glob("*.stepscope.json")
    trace = d / json.loads(manifest_path.read_text())["trace_file"]
    from stepscope import _cli

    cli = _cli.executable()
    if cli is None:
        return {"check": "request shares", "ok": False, "error": "the installed wheel carries no stepscope command"}
    run = subprocess.run([cli, "analyze", "--json", "--requests=0", str(trace)],
                         capture_output=True, text=True, timeout=300, check=False)
    if run.returncode != 0:
        return {"check": "request shares", "ok": False, "error": run.stderr[-2000:]}
    doc = json.loads(run.stdout)
    steps = doc["traces"][0]["steps"]
    (listed,) = doc["requests"]
    got = {r["id"]: r["gpu_ms"] for r in listed["requests"]}
    # What each request's share should be: each iteration's kernel time split by tokens.
    want: dict[str, float] = {}
    for st in steps:
        total = sum(st["tokens"])
        for rid, t in zip(st["requests"], st["tokens"], strict=True):
            want[rid] = want.get(rid, 0.0) + st["kernel_us"] / 1e3 * t / total
    kernel_ms = sum(st["kernel_us"] for st in steps) / 1e3
    close = all(abs(got[k] - want[k]) <= 1e-6 * max(1.0, want[k]) for k in want)
    return {
        "check": "request shares of CUPTI kernel time (analyze --requests)",
        "cli": cli,
        "iterations": [(st["name"], st["kernel_count"], round(st["kernel_us"], 1)) for st in steps],
        "kernel_ms": kernel_ms,
        "gpu_ms_by_request": got,
        "sum_of_shares_ms": sum(got.values()),
        "ok": len(steps) == len(plan) and kernel_ms > 0 and close and set(got) == set(want)
        and abs(sum(got.values()) - kernel_ms) <= 1e-6 * kernel_ms,
    }


# ---------------------------------------------------------------------------------------------
# A Llama-shaped model for the graph, floor and kernel-to-op checks.

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 14336, "vocab_size": 32000, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip
DECODE_REQS, CONTEXT = 32, 512  # each decode request attends over 512 tokens (511 computed + 1)
PREFILL = 2048  # tokens of one prefill request, computed 0
STEPS, G_DELAY, G_MAX = 24, 6, 10  # the window: steps 7..16
PREFILL_STEPS = {1, 9, 17}  # a request's prefill every 8 steps, eager; the rest decode in a graph


class Model:
    """A dense decoder (no rotary: positions change no FLOP or byte) in plain torch ops."""

    def __init__(self, cfg: dict, device: str, dtype: torch.dtype) -> None:
        g = torch.Generator(device=device).manual_seed(0)
        self.h, self.n, self.k, self.d = (cfg["hidden_size"], cfg["num_attention_heads"],
                                          cfg["num_key_value_heads"], cfg["head_dim"])
        self.i, self.v, self.eps = cfg["intermediate_size"], cfg["vocab_size"], cfg["rms_norm_eps"]
        h, n, k, d, i = self.h, self.n, self.k, self.d, self.i

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, device=device) * 0.02).to(dtype)

        self.embed = w(self.v, h)
        self.layers = [
            {"ln1": torch.ones(h, device=device, dtype=dtype), "qkv": w((n + 2 * k) * d, h),
             "o": w(h, n * d), "ln2": torch.ones(h, device=device, dtype=dtype),
             "gate_up": w(2 * i, h), "down": w(h, i)}
            for _ in range(cfg["num_hidden_layers"])
        ]  # fmt: skip
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = w(self.v, h)
        L = len(self.layers)
        # The decode batch's KV cache: CONTEXT slots per request, the last one written each step.
        self.kc = [torch.zeros(DECODE_REQS, k, CONTEXT, d, device=device, dtype=dtype) for _ in range(L)]
        self.vc = [torch.zeros_like(c) for c in self.kc]
        self.pos = torch.tensor([CONTEXT - 1], device=device)
        self.tokens = torch.zeros(DECODE_REQS, dtype=torch.long, device=device)

    def matmul_weights(self) -> list[torch.Tensor]:
        """Every weight a step reads through a matmul (what the floor counts)."""
        return [t for lay in self.layers for key, t in lay.items() if key not in ("ln1", "ln2")] + [self.lm_head]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        rep = self.n // self.k
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def _layers(self, x: torch.Tensor, attn) -> torch.Tensor:  # noqa: ANN001
        F = torch.nn.functional
        for li, lay in enumerate(self.layers):
            r = x
            x = F.rms_norm(x, (self.h,), lay["ln1"], self.eps)
            q, k, v = (x @ lay["qkv"].T).split([self.n * self.d, self.k * self.d, self.k * self.d], -1)
            x = r + attn(li, q, k, v) @ lay["o"].T
            r = x
            x = F.rms_norm(x, (self.h,), lay["ln2"], self.eps)
            gate, up = (x @ lay["gate_up"].T).chunk(2, -1)
            x = r + (F.silu(gate) * up) @ lay["down"].T
        return F.rms_norm(x, (self.h,), self.norm, self.eps)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """One request's prompt: causal attention over itself; the last token's logits."""
        T = tokens.shape[0]

        def attn(li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q = q.view(1, T, self.n, self.d).transpose(1, 2)
            k = k.view(1, T, self.k, self.d).transpose(1, 2)
            v = v.view(1, T, self.k, self.d).transpose(1, 2)
            return self._attend(q, k, v, True).transpose(1, 2).reshape(T, self.n * self.d)

        x = self._layers(self.embed[tokens], attn)
        return (x[-1:] @ self.lm_head.T).argmax(-1)

    def decode(self, batch: int | None = None) -> None:
        """The decode batch, static shapes (what a graph captures): each request's new token's
        K and V written into its cache's last slot, attention over the whole cache, the next
        tokens written back into the input buffer. `batch`: the first that many requests of
        the buffers (as vLLM captures one graph per batch size over shared buffers)."""
        R = batch or self.kc[0].shape[0]
        kc, vc, tokens = [c[:R] for c in self.kc], [c[:R] for c in self.vc], self.tokens[:R]

        def attn(li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kc[li].index_copy_(2, self.pos, k.view(R, self.k, 1, self.d))
            vc[li].index_copy_(2, self.pos, v.view(R, self.k, 1, self.d))
            q = q.view(R, self.n, 1, self.d)
            return self._attend(q, kc[li], vc[li], False).reshape(R, self.n * self.d)

        x = self._layers(self.embed[tokens], attn)
        tokens.copy_((x @ self.lm_head.T).argmax(-1))


def floor_from_tensors(model: Model, tokens: int, requests: int, pairs: int, kv_tokens: int,
                       peak_tflops: float, peak_gbs: float) -> dict:
    """A step's floor from the model's own tensors (not analyze's closed form): every matmul
    weight read once, 2 FLOPs a multiply-add over the step's tokens (the LM head over one token
    a request), attention's QKᵀ and PV over `pairs` query-key pairs per head, the KV read and
    written: `kv_tokens` positions read, `tokens` written."""
    L = len(model.layers)
    weights = model.matmul_weights()
    elem = weights[0].element_size()
    wbytes = sum(t.numel() for t in weights) * elem
    body = sum(t.numel() for t in weights[:-1])
    flops = 2 * tokens * body + 2 * requests * model.lm_head.numel() + 4 * L * model.n * model.d * pairs
    kv = L * 2 * model.k * model.d * elem * (kv_tokens + tokens)
    compute_us, memory_us = flops / (peak_tflops * 1e6), (wbytes + kv) / (peak_gbs * 1e3)
    return {"flops": flops, "bytes": wbytes + kv, "floor_us": max(compute_us, memory_us),
            "bound": "compute" if compute_us >= memory_us else "memory"}


# ---------------------------------------------------------------------------------------------
# Reading a Kineto trace without stepscope (the independent side of each comparison).


def load_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def attribute(events: list[dict], step_prefix: str = "execute_") -> dict:
    """Each device event's step by its launch: the runtime call with its correlation id, inside
    which step annotation (on the CPU) it began. Returns per step (ts order) its device events
    and its runtime calls, and the device events that no step launched."""
    steps = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith(step_prefix)), key=lambda e: e["ts"])  # fmt: skip
    runtime = {e["args"]["correlation"]: e for e in events
               if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}  # fmt: skip
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]

    def step_of(ts: float) -> int | None:
        for i, s in enumerate(steps):
            if s["ts"] <= ts <= s["ts"] + s["dur"]:
                return i
        return None

    per = [{"name": s["name"], "device": [], "runtime": []} for s in steps]
    for r in runtime.values():
        i = step_of(r["ts"])
        if i is not None:
            per[i]["runtime"].append(r)
    outside = []
    for e in device:
        r = runtime.get(e.get("args", {}).get("correlation"))
        i = step_of(r["ts"]) if r is not None else None
        (outside if i is None else per[i]["device"]).append(e)
    return {"steps": per, "outside": outside, "runtime": runtime}


def load_header(path: Path) -> dict:
    """stepscope's header of a trace, with Kineto's baseTimeNanoseconds beside it."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    h = doc.get("stepscope") or {}
    h = json.loads(h) if isinstance(h, str) else dict(h)
    h["_base_time_ns"] = doc.get("baseTimeNanoseconds")
    return h


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def graph_kernel_nodes(graph: torch.cuda.CUDAGraph) -> dict:
    """The captured graph's nodes by type, from the CUDA runtime (cudaGraphGetNodes and
    cudaGraphNodeGetType through ctypes on the libcudart torch loaded)."""
    import ctypes

    lib = None
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise RuntimeError("no libcudart found")
    raw = ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    if lib.cudaGraphGetNodes(raw, None, ctypes.byref(count)) != 0:
        raise RuntimeError("cudaGraphGetNodes failed")
    nodes = (ctypes.c_void_p * count.value)()
    if lib.cudaGraphGetNodes(raw, nodes, ctypes.byref(count)) != 0:
        raise RuntimeError("cudaGraphGetNodes failed")
    names = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty",
             6: "wait_event", 7: "event_record"}  # fmt: skip
    kinds: dict[str, int] = {}
    for node in nodes:
        t = ctypes.c_int(-1)
        lib.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
        kinds[names.get(t.value, str(t.value))] = kinds.get(names.get(t.value, str(t.value)), 0) + 1
    return kinds


def ops_of_launches(events: list[dict], runtime: list[dict]) -> list[str]:
    """The innermost CPU op (cat cpu_op) around each runtime call, in call order."""
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    out = []
    for r in sorted(runtime, key=lambda r: r["ts"]):
        inner = [o for o in ops if o.get("tid") == r.get("tid") and o["ts"] <= r["ts"] <= o["ts"] + o["dur"]]
        out.append(min(inner, key=lambda o: o["dur"])["name"] if inner else "?")
    return out


def cli_json(args: list[str]) -> dict:
    from stepscope import _cli

    cli = _cli.executable()
    if cli is None:
        raise RuntimeError("the installed wheel carries no stepscope command")
    run = subprocess.run([cli, *args], capture_output=True, text=True, timeout=300, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"stepscope {' '.join(args)}: {run.stderr[-2000:]}")
    return json.loads(run.stdout)


def peaks_of(doc: dict) -> tuple[float, float] | None:
    t = doc["traces"][0]
    p = t.get("peaks") or doc.get("peaks")
    if not p:
        return None
    return p.get("tflops"), p.get("gbs")


def graphs(out: Path) -> dict:
    """Checks 5 and 6: the graph-replay engine loop, its analysis, the floor and kernel to op."""
    d = out / "graphs"
    d.mkdir(parents=True, exist_ok=True)
    # Without a GPU (a dry run of this script's own code on a CPU machine): a small model, eager
    # decode in place of the graph, the data sheet's H100 peaks given to analyze.
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    cfg = CONFIG if gpu else dict(CONFIG, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=64, intermediate_size=512, vocab_size=1000,
                                  torch_dtype="float32")  # fmt: skip
    torch.manual_seed(0)
    model = Model(cfg, dev, torch.bfloat16 if gpu else torch.float32)
    prompt = torch.randint(0, cfg["vocab_size"], (PREFILL if gpu else 64,), device=dev)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    # Warm up on a side stream (as torch's graph docs ask), then the eager decode traced: its
    # kernels and the ops that launched them, in order.
    if gpu:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model.decode()
                model.prefill(prompt)
        torch.cuda.current_stream().wait_stream(s)
    sync()
    with torch.profiler.profile(activities=acts) as eager_prof:
        with torch.profiler.record_function("eager_decode"):
            model.decode()
        sync()
    eager_path = d / "eager_decode.pt.trace.json"
    eager_prof.export_chrome_trace(str(eager_path))
    # The capture, traced as vLLM's capture_torch_profiler does (capture_traces/, one
    # annotation per captured shape).
    (d / "capture_traces").mkdir(exist_ok=True)
    capture_path = d / "capture_traces" / f"capture_{DECODE_REQS}_FULL.pt.trace.json"
    nodes: dict[str, int] = {}
    if gpu:
        def new_graph() -> tuple[torch.cuda.CUDAGraph, bool]:
            try:
                return torch.cuda.CUDAGraph(keep_graph=True), True
            except TypeError:
                return torch.cuda.CUDAGraph(), False

        graph, kept = new_graph()
        try:
            with torch.profiler.profile(activities=acts) as cap_prof:
                with torch.profiler.record_function(f"capture_{DECODE_REQS}_FULL"):
                    with torch.cuda.graph(graph):
                        model.decode()
                sync()
            cap_prof.export_chrome_trace(str(capture_path))
            capture_error = None
        except Exception as e:  # noqa: BLE001 - the capture without its trace, and why
            capture_error = f"{type(e).__name__}: {e}"
            sync()
            graph, kept = new_graph()
            with torch.cuda.graph(graph):
                model.decode()
        if kept:
            nodes = graph_kernel_nodes(graph)
            graph.instantiate()
        replay = graph.replay
        replay()
    else:
        capture_error = None
        with torch.profiler.profile(activities=acts) as cap_prof:
            with torch.profiler.record_function(f"capture_{DECODE_REQS}_FULL"):
                model.decode()
        cap_prof.export_chrome_trace(str(capture_path))
        replay = model.decode
    sync()

    # The engine loop: one step in flight, as vLLM's async scheduling.
    p = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": str(d), "delay_iterations": G_DELAY,
         "max_iterations": G_MAX, "torch_profiler_with_stack": False},
        "graphs_rank0",
    )  # fmt: skip
    shape = p.set_model(cfg)
    host_tokens = torch.empty(DECODE_REQS, dtype=torch.long, pin_memory=gpu)
    host_first = torch.empty(1, dtype=torch.long, pin_memory=gpu)
    decode_ids = [f"d{j}" for j in range(DECODE_REQS)]
    p.start()
    events: list = []
    plan = []
    t_loop = time.perf_counter()
    for step in range(1, STEPS + 1):
        if step in PREFILL_STEPS:
            it = stepscope.Iteration(1, len(prompt), 0, 0, request_ids=[f"p{step}"], request_tokens=[len(prompt)],
                                     request_prefill=[True], request_computed=[0])
            plan.append("prefill")
        else:
            it = stepscope.Iteration(0, 0, DECODE_REQS, DECODE_REQS, request_ids=decode_ids,
                                     request_tokens=[1] * DECODE_REQS,
                                     request_prefill=[False] * DECODE_REQS,
                                     request_computed=[CONTEXT - 1] * DECODE_REQS)
            plan.append("decode")
        p.step(it)
        if step in PREFILL_STEPS:
            host_first.copy_(model.prefill(prompt), non_blocking=True)
        else:
            replay()
            host_tokens.copy_(model.tokens, non_blocking=True)
        if gpu:
            e = torch.cuda.Event()
            e.record()
            events.append(e)
            if len(events) >= 2:
                events[-2].synchronize()  # the previous step's output, as vLLM waits for it
        p.step_end()
    sync()
    loop_s = time.perf_counter() - t_loop
    p.stop()
    flushed = p.flush(300)
    (manifest_path,) = d.glob("*.stepscope.json")
    manifest = json.loads(manifest_path.read_text())
    trace = d / manifest["trace_file"]
    raw = load_trace(trace)
    attr = attribute(raw)
    # A replay's device work: its kernel, memcpy and memset nodes.
    graph_kernels_expected = sum(nodes.get(k, 0) for k in ("kernel", "memcpy", "memset")) or None

    # What Kineto gives a graph kernel.
    launches = {c for c, r in attr["runtime"].items() if "GraphLaunch" in r["name"]}
    gk = [e for e in raw if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launches]
    arg_keys = sorted({k for e in gk for k in e.get("args", {})})
    graph_ids = sorted({e["args"].get("graph id") for e in gk}, key=str)
    # Per replay: its kernels in time order, their node ids, and their count.
    replays = []
    for c in sorted(launches):
        ks = sorted((e for e in gk if e["args"]["correlation"] == c), key=lambda e: e["ts"])
        node_ids = [e["args"].get("graph node id") for e in ks]
        replays.append({"correlation": c, "kernels": len(ks), "names": [e["name"] for e in ks],
                        "node_ids": node_ids,
                        "node_ids_ascending_in_time": all(a is not None and b is not None and a < b
                                                          for a, b in zip(node_ids, node_ids[1:], strict=False))})  # fmt: skip

    # stepscope analyze on the same trace.
    doc = cli_json(["analyze", "--json", str(trace)] + ([] if gpu else ["--peak-tflops", "989.4", "--peak-gbs", "3350"]))
    (d / "analyze.json").write_text(json.dumps(doc))
    t = doc["traces"][0]
    steps = t["steps"]
    rows, all_ok = [], True
    peaks = t.get("peaks") or {}
    for i, st in enumerate(steps):
        raw_step = attr["steps"][i] if i < len(attr["steps"]) else {"device": [], "runtime": [], "name": None}
        # The step's kind by its name (its counts): a prefill names one context request.
        kinds = "prefill" if st["name"].startswith("execute_context_1(") else "decode"
        la = st["gpu"]["launches"] if st.get("gpu") else {}
        raw_graph = [r for r in raw_step["runtime"] if "GraphLaunch" in r["name"]]
        raw_kernels = [e for e in raw_step["device"] if e.get("cat") == "kernel"]
        raw_busy = union_us([(e["ts"], e["ts"] + e["dur"]) for e in raw_step["device"]])
        row = {"step": st["name"], "kind": kinds, "raw_name": raw_step["name"],
               "graph_launches": la.get("graph_launches"), "graph_kernels": la.get("graph_kernels"),
               "kernel_launches": la.get("kernel_launches"), "kernel_count": st.get("kernel_count"),
               "raw_graph_launches": len(raw_graph), "raw_kernels": len(raw_kernels),
               "busy_us": st["gpu"]["busy_us"] if st.get("gpu") else None,
               "raw_busy_us": raw_busy, "verdict": (st.get("gpu") or {}).get("verdict")}  # fmt: skip
        ok = row["raw_name"] == st["name"] and row["kernel_count"] == len(raw_kernels)
        if kinds == "decode":
            ok &= la.get("graph_launches") == 1 and (graph_kernels_expected is None
                                                     or la.get("graph_kernels") == graph_kernels_expected)
            ok &= len(raw_kernels) == nodes.get("kernel", len(raw_kernels))
        elif kinds == "prefill":
            ok &= la.get("graph_launches") == 0 and la.get("kernel_launches", 0) > 0
        ok &= row["busy_us"] is not None and abs(row["busy_us"] - raw_busy) <= 0.02 + 1e-6 * raw_busy
        fl = st.get("floor")
        if fl and peaks and kinds in ("decode", "prefill"):
            if kinds == "decode":
                mine = floor_from_tensors(model, DECODE_REQS, DECODE_REQS,
                                          DECODE_REQS * CONTEXT, DECODE_REQS * CONTEXT,
                                          peaks["tflops"], peaks["gbs"])  # fmt: skip
            else:
                T = len(prompt)
                mine = floor_from_tensors(model, T, 1, T * (T + 1) // 2, T,
                                          peaks["tflops"], peaks["gbs"])
            row["floor"] = {"analyze": fl, "from_tensors": mine,
                            "of_busy_from_kernels": mine["floor_us"] / raw_busy if raw_busy else None}
            ok &= fl["bound"] == ("memory" if kinds == "decode" else "compute") == mine["bound"]
            ok &= abs(fl["floor_us"] - mine["floor_us"]) <= 0.01 * mine["floor_us"]
        elif kinds in ("decode", "prefill"):
            ok = False
            row["floor"] = None
        row["ok"] = bool(ok)
        all_ok &= bool(ok)
        rows.append(row)

    # Kernel to op: the replay's kernels (time order) against the eager decode's kernels, and
    # the capture's launches and the ops around them.
    eager = load_trace(eager_path)
    eager_attr = attribute(eager, "eager_decode")
    eager_k = sorted((e for e in eager_attr["steps"][0]["device"] if e.get("cat") == "kernel"),
                     key=lambda e: e["ts"]) if eager_attr["steps"] else []  # fmt: skip
    eager_all = sorted(eager_attr["steps"][0]["device"], key=lambda e: e["ts"]) if eager_attr["steps"] else []
    eager_runtime = [eager_attr["runtime"][e["args"]["correlation"]] for e in eager_all]
    eager_ops = ops_of_launches(eager, eager_runtime)
    cap = load_trace(capture_path) if capture_path.exists() else []
    cap_steps = attribute(cap, "capture_")
    # The launches between the stream's BeginCapture and EndCapture: the graph's nodes.
    cap_rt = [e for e in cap if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    begin = min((e["ts"] for e in cap_rt if "BeginCapture" in e["name"]), default=float("inf"))
    end = min((e["ts"] for e in cap_rt if "EndCapture" in e["name"]), default=float("-inf"))
    cap_launch = sorted((r for r in (cap_steps["steps"][0]["runtime"] if cap_steps["steps"] else [])
                         if begin < r["ts"] < end and ("LaunchKernel" in r["name"] or "Memcpy" in r["name"]
                                                       or "Memset" in r["name"])),
                        key=lambda r: r["ts"])  # fmt: skip
    cap_ops = ops_of_launches(cap, cap_launch)
    first = replays[0] if replays else {"names": [], "node_ids": []}
    by_node = [n for _, n in sorted(zip(first["node_ids"], first["names"], strict=True),
                                    key=lambda x: (x[0] is None, x[0] or 0))]
    to_op = {
        "graph_nodes": nodes,
        "capture_traced": capture_error or "yes",
        "graph_arg_keys": arg_keys,
        "graph_ids": graph_ids[:8],
        "replays_in_trace": len(replays),
        "replay_kernel_counts": sorted({r["kernels"] for r in replays}),
        "node_ids_first_replay": first["node_ids"][:8],
        "node_ids_same_every_replay": len({tuple(r["node_ids"]) for r in replays}) <= 1,
        "node_ids_ascending_in_time": all(r["node_ids_ascending_in_time"] for r in replays),
        "eager_kernels": len(eager_k),
        "replay_names_equal_eager_in_order": first["names"] == [e["name"] for e in eager_k],
        "replay_names_by_node_id_equal_eager": by_node == [e["name"] for e in eager_k],
        "capture_launches": len(cap_launch),
        "capture_launch_names": sorted({r["name"] for r in cap_launch}),
        "capture_ops_equal_eager_ops": cap_ops == eager_ops,
        "capture_runtime_correlations": [r["args"]["correlation"] for r in cap_launch][:4],
        "capture_ops_head": cap_ops[:12],
        "eager_ops_head": eager_ops[:12],
        "replay_names_head": first["names"][:12],
    }
    first_ts = min((e["ts"] for e in raw if e.get("cat") == "user_annotation"), default=0.0)
    result = {
        "check": "CUDA graphs as vLLM decodes: attribution, floor, kernel to op",
        "model_shape_recorded": {k: shape.get(k) for k in ("layers", "hidden", "params", "unknown")},
        "status": manifest["status"], "flushed": flushed, "loop_s": loop_s,
        "iterations": manifest["iterations"], "first_step": manifest["first_step"],
        "plan": plan, "steps_analyzed": len(steps), "steps_raw": len(attr["steps"]),
        "device_events_outside_window": len(attr["outside"]),
        "outside_names": sorted({e["name"] for e in attr["outside"]})[:6],
        "outside_detail": [
            {"name": e["name"][:60], "ts_from_first_step_us": e["ts"] - first_ts,
             "launch": (attr["runtime"].get(e["args"].get("correlation")) or {}).get("name"),
             "launch_ts_from_first_step_us": (attr["runtime"].get(e["args"].get("correlation")) or {}).get("ts", first_ts) - first_ts}
            for e in attr["outside"][:12]
        ],
        "graph_launches_outside_steps": [
            {"ts_from_first_step_us": r["ts"] - first_ts, "kernels": sum(1 for e in gk if e["args"]["correlation"] == c)}
            for c, r in attr["runtime"].items() if "GraphLaunch" in r["name"]
            and not any(r is x for st in attr["steps"] for x in st["runtime"])
        ],
        "trace": str(trace.relative_to(out)), "trace_bytes": trace.stat().st_size,
        "peaks": peaks, "floor_missing": t.get("floor_missing"),
        # What analyze left out as launched after the stop (the header's stop_unix_ns), and the
        # kernels it kept: each step's, counted from the raw JSON.
        "after_stop": t.get("after_stop"),
        "kernels_kept": t["kernels"]["count"],
        "kernels_in_steps_raw": sum(1 for st in attr["steps"] for e in st["device"] if e.get("cat") == "kernel"),
        "header_stop_unix_ns": (doc_header := load_header(trace)).get("stop_unix_ns"),
        "base_time_ns": doc_header.get("_base_time_ns"),
        "steps": rows, "kernel_to_op": to_op,
    }  # fmt: skip
    # Device work outside the steps may only be the next step's, launched after the window
    # (recorded until the writer stops CUPTI: docs/gpu.md); none may come from before it.
    last_end = max((s["ts"] + s["dur"] for s in raw if s.get("cat") == "user_annotation"), default=0.0)
    after_only = all((attr["runtime"].get(e["args"].get("correlation")) or {}).get("ts", -1.0) > last_end
                     for e in attr["outside"])  # fmt: skip
    # With the stop in the header, the trace's kernels are exactly its steps' (on a GPU).
    kept_ok = not gpu or result["kernels_kept"] == result["kernels_in_steps_raw"]
    result["ok"] = bool(all_ok and len(steps) == G_MAX and after_only and kept_ok
                        and manifest["status"] == "complete" and (nodes.get("kernel") or not gpu))
    return result

BATCHES = (32, 16, 8)  # one graph per decode batch size, captured in one trace as vLLM does


def decode_batch(step_name: str) -> int:
    """The requests of a decode step from its annotation: `execute_context_0(0)_generation_B(B)`."""
    return int(step_name.split("_generation_")[1].split("(")[0])


def graphs_batches(out: Path) -> dict:
    """Check 6 again as vLLM has it: one graph per batch size, all captured in one trace
    (capture_{batch}_FULL each), decode steps cycling through them in a window; analyze
    --graph-capture on it, and each replay's kernels against an eager run of its batch size."""
    d = out / "graphs_batches"
    (d / "capture_traces").mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available()
    if not gpu:
        return {"check": "graphs_batches", "ok": False, "error": "no GPU"}
    torch.manual_seed(0)
    model = Model(CONFIG, "cuda", torch.bfloat16)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for b in BATCHES:
                model.decode(b)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as eager_prof:
        for b in BATCHES:
            with torch.profiler.record_function(f"eager_{b}"):
                model.decode(b)
            torch.cuda.synchronize()
    eager_path = d / "eager_batches.pt.trace.json"
    eager_prof.export_chrome_trace(str(eager_path))
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    nodes: dict[int, dict] = {}
    with torch.profiler.profile(activities=acts) as cap_prof:
        for b in BATCHES:
            try:
                g = torch.cuda.CUDAGraph(keep_graph=True)
            except TypeError:  # a torch without keep_graph: no node count
                g = torch.cuda.CUDAGraph()
            with torch.profiler.record_function(f"capture_{b}_FULL"):
                with torch.cuda.graph(g):
                    model.decode(b)
            graphs[b] = g
        torch.cuda.synchronize()
    cap_prof.export_chrome_trace(str(d / "capture_traces" / "capture_batches.pt.trace.json"))
    for b, g in graphs.items():
        try:
            nodes[b] = graph_kernel_nodes(g)
            g.instantiate()
        except RuntimeError:  # not kept: instantiated at capture's end
            nodes[b] = {}
    p = stepscope.WorkerProfiler(
        {"profiler": "torch", "torch_profiler_dir": str(d), "delay_iterations": 3,
         "max_iterations": 9, "torch_profiler_with_stack": False},
        "batches_rank0",
    )  # fmt: skip
    p.set_model(CONFIG)
    events: list = []
    p.start()
    for step in range(16):
        b = BATCHES[step % len(BATCHES)]
        p.step(stepscope.Iteration(0, 0, b, b, request_ids=[f"d{j}" for j in range(b)],
                                   request_tokens=[1] * b, request_prefill=[False] * b,
                                   request_computed=[CONTEXT - 1] * b))  # fmt: skip
        graphs[b].replay()
        e = torch.cuda.Event()
        e.record()
        events.append(e)
        if len(events) >= 2:
            events[-2].synchronize()
        p.step_end()
    torch.cuda.synchronize()
    p.stop()
    p.flush(300)
    (manifest_path,) = d.glob("*.stepscope.json")
    trace = d / json.loads(manifest_path.read_text())["trace_file"]
    doc = cli_json(["analyze", "--json", "--graph-capture", str(d / "capture_traces"), str(trace)])
    (d / "analyze.json").write_text(json.dumps(doc))
    t = doc["traces"][0]
    want = {b: sum(nodes[b].get(k, 0) for k in ("kernel", "memcpy", "memset")) or None for b in BATCHES}
    per_step = []
    ok = True
    for st in t["steps"]:
        b = decode_batch(st["name"])
        la = st["gpu"]["launches"]
        good = la["graph_launches"] == 1 and la["graph_kernels"] == (want[b] or la["graph_kernels"])
        per_step.append((b, la["graph_kernels"], want[b], good))
        ok &= good
    # Each replay's kernels in time order against the eager run of its batch size.
    raw = load_trace(trace)
    eager = load_trace(eager_path)
    eager_names = {}
    for b in BATCHES:
        a = attribute(eager, f"eager_{b}")
        eager_names[b] = [e["name"] for e in sorted(a["steps"][0]["device"], key=lambda e: e["ts"])]
    attr = attribute(raw)
    names_equal = []
    for st in attr["steps"]:
        b = decode_batch(st["name"])
        launches = {r["args"]["correlation"] for r in st["runtime"] if "GraphLaunch" in r["name"]}
        ks = sorted((e for e in st["device"] if e["args"].get("correlation") in launches), key=lambda e: e["ts"])
        names_equal.append([e["name"] for e in ks] == eager_names[b])
    g = t.get("graph_ops") or {}
    return {"check": "one graph per batch size, captured in one trace (vLLM's layout)",
            "nodes": nodes, "steps": per_step, "names_equal_eager": names_equal,
            "capture_lengths": {b: len(eager_names[b]) for b in BATCHES},
            "graph_ops": {k: g.get(k) for k in ("replays", "mapped", "unmapped", "captures")},
            "ops_head": (g.get("ops") or [])[:6],
            "ok": bool(ok and all(names_equal) and g.get("mapped") == len(t["steps"]))}


# ---------------------------------------------------------------------------------------------
# NVIDIA's tools reading stepscope's capture range and NVTX ranges.

LOOP_ITERS, LOOP_PER, LOOP_DELAY, LOOP_MAX = 10, 4, 3, 2
RANGE = "execute_context_0(0)_generation_8(8)"  # what a decode step of 8 requests is named


def loop_cuda() -> int:
    """The Python engine loop with the cuda backend: LOOP_PER one-kernel ops an iteration (an
    in-place multiply-add on one tensor), a window of LOOP_MAX iterations after LOOP_DELAY.
    Prints which iterations ran and the window's kernels, as the C toy does."""
    x = torch.zeros(1 << 20, device="cuda")
    x.mul_(0.5)
    torch.cuda.synchronize()
    p = stepscope.WorkerProfiler({"profiler": "cuda", "delay_iterations": LOOP_DELAY,
                                  "max_iterations": LOOP_MAX}, "loop")  # fmt: skip
    p.start()
    running = []
    for _ in range(LOOP_ITERS):
        p.step(stepscope.Iteration(0, 0, 8, 8))
        running.append(int(p.is_running))
        for _ in range(LOOP_PER):
            x.mul_(0.5)
        torch.cuda.synchronize()
        p.step_end()
    p.stop()
    st = p.status()
    print(json.dumps({"iterations": LOOP_ITERS, "per_iteration": LOOP_PER, "running": running,
                      "window_iterations": sum(running), "window_kernels": sum(running) * LOOP_PER,
                      "kernels": LOOP_ITERS * LOOP_PER, "last_error": st["last_error"]}), flush=True)
    return 0


def sh(cmd: list[str], timeout: float, **kw) -> dict:  # noqa: ANN003
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
        return {"rc": r.returncode, "out": r.stdout, "err": r.stderr, "s": time.perf_counter() - t0}
    except subprocess.TimeoutExpired as e:
        return {"rc": "timeout", "out": str(e.stdout or ""), "err": str(e.stderr or ""), "s": timeout}
    except OSError as e:
        return {"rc": f"oserror: {e}", "out": "", "err": "", "s": 0.0}


def toy_json(text: str) -> dict | None:
    for line in text.splitlines():
        if line.startswith('{"iterations"'):
            return json.loads(line)
    return None


def ncu_kernels(csv_text: str) -> list[dict]:
    """Rows of ncu's --csv --page raw output (one per profiled kernel; the first two lines are
    the header and the units)."""
    import csv
    import io

    lines = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    return [r for r in rows if r.get("Kernel Name") and r.get("ID", "").isdigit()]


def nvidia_tools(out: Path) -> list[dict]:
    d = out / "tools"
    d.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[1]
    results = []
    ncu = shutil.which("ncu") or next(iter(sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))), None)
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    libdir = root / "target" / "release"
    toy = d / "gpu_toy"
    build = sh([str(nvcc), "-O2", "-o", str(toy), str(root / "scripts" / "gpu_toy.cu"), f"-I{root / 'include'}",
                f"-L{libdir}", "-lstepscope", "-Xlinker", f"-rpath,{libdir}"], 180) if nvcc else {"rc": "no nvcc"}
    os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    ncu_version = sh([str(ncu), "--version"], 30)["out"].strip().splitlines()[-1:] if ncu else None
    results.append({"check": "toy engine built with nvcc", "nvcc": nvcc, "ncu": str(ncu), "ncu_version": ncu_version,
                    "rc": build["rc"], "err": build.get("err", "")[-1500:], "ok": build["rc"] == 0})
    (d / "ncu_help.txt").write_text(sh([str(ncu), "--help"], 30)["out"] if ncu else "")
    targets = []
    if build["rc"] == 0:
        plain = sh([str(toy), str(LOOP_ITERS), str(LOOP_PER)], 60)
        results.append({"check": "toy engine, plain run", "rc": plain["rc"], "toy": toy_json(plain["out"]),
                        "err": plain["err"][-800:], "ok": plain["rc"] == 0})
        targets.append(("C toy", [str(toy), str(LOOP_ITERS), str(LOOP_PER)]))
    targets.append(("Python loop", [sys.executable, str(Path(__file__).resolve()), "--loop-cuda"]))
    metric = ["--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw"]
    working = None
    for label, cmd in targets:
        if ncu is None:
            break
        tag = "toy" if label == "C toy" else "py"
        # 1. Only the capture range: cuProfilerStart/Stop, what stepscope's cuda backend calls.
        r = sh([str(ncu), "--profile-from-start", "off", *metric, *cmd], 240)
        rows = ncu_kernels(r["out"])
        want = toy_json(r["out"])
        (d / f"ncu_range_{tag}.txt").write_text(r["out"] + "\n--- stderr\n" + r["err"])
        results.append({"check": f"ncu --profile-from-start off, {label}", "rc": r["rc"], "seconds": r["s"],
                        "profiled_kernels": len(rows), "run": want,
                        "names": sorted({x["Kernel Name"] for x in rows})[:3], "err": r["err"][-600:],
                        "ok": want is not None and len(rows) == want["window_kernels"] > 0})
        # 2. Only the kernels inside the iteration's NVTX range: three spellings of the filter
        # for the toy, the Python loop with the first that profiled any kernel.
        spellings = [f"stepscope@{RANGE}/", "regex:stepscope@execute_.*/", "regex:execute_.*/"]
        for flt in spellings if tag == "toy" or not working else [working]:
            r = sh([str(ncu), "--nvtx", "--nvtx-include", flt, "--print-nvtx-rename", "kernel", *metric, *cmd], 240)
            rows = ncu_kernels(r["out"])
            want = toy_json(r["out"])
            results.append({"check": f"ncu --nvtx --nvtx-include {flt!r}, {label}", "rc": r["rc"],
                            "seconds": r["s"], "profiled_kernels": len(rows), "run": want,
                            "names_as_renamed": sorted({x["Kernel Name"] for x in rows})[:3],
                            "err": r["err"][-600:],
                            "ok": want is not None and len(rows) == want["window_kernels"] > 0})
            if len(rows) > 0:
                working = working or flt
                break
        if tag != "toy":
            continue
        # 3. The report per NVTX range: each range's name (the step's counts) and payload.
        rep = d / f"nvtx_{tag}"
        r = sh([str(ncu), "--nvtx", "--profile-from-start", "off", "--metrics", "gpu__time_duration.sum",
                "-o", str(rep), "-f", *cmd], 240)
        summary = sh([str(ncu), "-i", f"{rep}.ncu-rep", "--print-summary", "per-nvtx"], 60)
        details = sh([str(ncu), "-i", f"{rep}.ncu-rep", "--page", "details", "--print-details", "all",
                      "--print-nvtx-rename", "kernel"], 60)  # fmt: skip
        (d / f"ncu_nvtx_{tag}.txt").write_text(summary["out"] + summary["err"] + "\n=== details\n"
                                               + details["out"][:200_000] + details["err"])
        results.append({"check": f"ncu report per NVTX range, {label}", "rc": [r["rc"], summary["rc"], details["rc"]],
                        "mentions_range": RANGE in summary["out"] + details["out"],
                        "mentions_domain": "stepscope" in summary["out"] + details["out"],
                        "summary_head": summary["out"][:1500], "err": (r["err"] + summary["err"])[-600:],
                        "ok": RANGE in summary["out"] + details["out"]})
    # 4. nsys, where one is found: the capture range from cudaProfilerApi.
    nsys = shutil.which("nsys") or next(iter(sorted(Path("/opt/nvidia").glob("**/nsys"))), None)
    if nsys and build["rc"] == 0:
        rep = d / "nsys_toy"
        r = sh([str(nsys), "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                "-t", "cuda,nvtx", "-o", str(rep), "-f", "true", str(toy), str(LOOP_ITERS), str(LOOP_PER)], 120)
        made = sorted(p.name for p in d.iterdir() if p.name.startswith("nsys_toy"))
        exp = {}
        if (d / "nsys_toy.nsys-rep").exists():
            exp = sh([str(nsys), "export", "--type", "sqlite", "-o", str(d / "nsys_toy.sqlite"),
                      str(d / "nsys_toy.nsys-rep")], 120)
        # This nsys (inside Nsight Compute's folder) carries no importer: a .qdstrm and no
        # report is what it can do, and the capture range is seen in its output.
        text = r["out"] + r["err"]
        no_importer = "Unable to retrieve the importer version" in text
        seen = "Capture range started" in text and "Capture range ended" in text
        results.append({"check": "nsys --capture-range=cudaProfilerApi, C toy", "nsys": str(nsys), "rc": r["rc"],
                        "files": made, "out": text[-1500:], "export": exp.get("rc"),
                        "skipped": "this nsys cannot import its .qdstrm (no importer)" if no_importer else None,
                        "ok": (d / "nsys_toy.nsys-rep").exists() or (no_importer and seen)})
    else:
        results.append({"check": "nsys", "nsys": str(nsys), "ok": False, "error": "no nsys or no toy"})
    return results


# ---------------------------------------------------------------------------------------------
# Overhead on the GPU machine.


def overhead(out: Path) -> list[dict]:
    import timeit

    results = []
    it = stepscope.Iteration(0, 0, 32, 32)
    idle = stepscope.WorkerProfiler({}, "idle")
    tl = stepscope.WorkerProfiler({"stepscope": {"timeline": True}}, "tl")
    run = stepscope.WorkerProfiler({"profiler": "cuda", "max_iterations": 100_000_000}, "run")
    run.start()

    def step_of(p):  # noqa: ANN001, ANN202
        def f() -> None:
            p.step(it)
            p.step_end()
        return f

    fs = {"idle": step_of(idle), "timeline_on": step_of(tl), "running_cuda_no_tool": step_of(run)}
    best = {k: float("inf") for k in fs}
    for _ in range(7):
        for k, f in fs.items():
            best[k] = min(best[k], timeit.timeit(f, number=50_000) / 50_000 * 1e9)
    run.stop()
    results.append({"check": "step()+step_end() from Python, ns (best of 7 rounds)", **best,
                    "ratio_timeline_to_idle": best["timeline_on"] / best["idle"],
                    "ratio_running_to_idle": best["running_cuda_no_tool"] / best["idle"], "ok": True})
    bench = sorted(Path(__file__).resolve().parents[1].glob("target/release/deps/step-*"))
    bench = [b for b in bench if os.access(b, os.X_OK) and b.suffix == ""]
    if bench:
        r = sh([str(bench[-1]), "--bench", "--warm-up-time", "0.5", "--measurement-time", "1.5", "step/"], 200)
        times, name = {}, None
        for ln in r["out"].splitlines():
            head = re.match(r"^(step/\S+)", ln)
            if head:
                name = head.group(1)
            m = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+)", ln)
            if m and name:
                times[name] = f"{m.group(1)} {m.group(2)}"
        results.append({"check": "Rust step bench (benches/step.rs), median", "rc": r["rc"], "times": times,
                        "raw_tail": r["out"][-400:], "ok": r["rc"] == 0})

    return results


def overhead_capture(out: Path) -> dict:
    """A decode step (a graph replay of the model, synchronized for timing) with nothing, with
    stepscope's Kineto backend capturing, and with torch.profiler capturing; then stop to disk."""
    d = out / "overhead"
    model = Model(CONFIG, "cuda", torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model.decode()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        model.decode()
    N = 40

    def steps(around) -> float:  # noqa: ANN001
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            with around():
                g.replay()
                torch.cuda.synchronize()
        return (time.perf_counter() - t0) / N * 1e6

    import contextlib

    base = [steps(contextlib.nullcontext) for _ in range(2)][-1]
    p = stepscope.WorkerProfiler({"profiler": "torch", "torch_profiler_dir": str(d / "ours"),
                                  "max_iterations": N + 1, "torch_profiler_with_stack": False}, "ovh")  # fmt: skip
    p.start()

    @contextlib.contextmanager
    def ours():  # noqa: ANN202
        p.step(stepscope.Iteration(0, 0, DECODE_REQS, DECODE_REQS))
        try:
            yield
        finally:
            p.step_end()

    p.step(stepscope.Iteration(0, 0, DECODE_REQS, DECODE_REQS))  # the window's first step starts Kineto
    p.step_end()
    ours_us = steps(ours)
    t0 = time.perf_counter()
    p.stop()
    ours_stop = time.perf_counter() - t0
    p.flush(300)
    ours_disk = time.perf_counter() - t0
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])  # fmt: skip
    prof.start()
    theirs_us = steps(lambda: torch.profiler.record_function("execute"))
    t0 = time.perf_counter()
    prof.stop()
    theirs_stop = time.perf_counter() - t0
    prof.export_chrome_trace(str(d / "torch_own.pt.trace.json.gz"))
    theirs_disk = time.perf_counter() - t0
    after = steps(contextlib.nullcontext)
    return {"check": "a captured decode step (graph replay + sync), us per step",
            "none": base, "none_after": after, "stepscope_kineto": ours_us, "torch_profiler": theirs_us,
            "stepscope_over_none": ours_us / base, "torch_over_none": theirs_us / base,
            "stop_s": {"stepscope": ours_stop, "torch": theirs_stop},
            "stop_to_disk_s": {"stepscope": ours_disk, "torch": theirs_disk},
            "ok": True}  # fmt: skip


def environment() -> dict:
    smi = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
              "--format=csv,noheader"], 30)  # fmt: skip
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "nvidia_smi": smi["out"].strip(), "python": sys.version.split()[0],
            "stepscope": stepscope.__version__, "glue": stepscope.kineto_glue(), "pid": os.getpid()}


def pack(out: Path) -> None:
    """What comes back from the GPU machine: the graph check's traces gzipped, the tools'
    texts and reports, in one tarball (the capture's own big traces left out)."""
    import tarfile

    with tarfile.open(out / "gpu_data.tar.gz", "w:gz") as tar:
        for p in sorted(out.rglob("*")):
            if not p.is_file() or p.name == "gpu_data.tar.gz" or p.stat().st_size > 40_000_000:
                continue
            if p.parent.name in ("torch", "stop", "requests", "ours") or p.name.startswith("torch_own"):
                continue
            if p.suffix in (".qdstrm", ".sqlite") or p.name == "gpu_toy":
                continue
            if p.suffix == ".json" and p.stat().st_size > 100_000:  # the eager and capture traces
                with open(p, "rb") as f, gzip.open(p.with_name(p.name + ".gz"), "wb") as z:
                    shutil.copyfileobj(f, z)
                p = p.with_name(p.name + ".gz")
            tar.add(p, arcname=str(p.relative_to(out)))


def main() -> int:
    if sys.argv[1:] == ["--loop-cuda"]:
        return loop_cuda()
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(environment()), flush=True)
    ok = True
    checks = [lambda: torch_backend(out), lambda: stop_latency(out), lambda: request_shares(out),
              cuda_backend, lambda: graphs(out), lambda: graphs_batches(out), lambda: nvidia_tools(out),
              lambda: overhead(out), lambda: overhead_capture(out)]
    names = ["torch_backend", "stop_latency", "request_shares", "cuda_backend", "graphs", "graphs_batches",
             "nvidia_tools", "overhead", "overhead_capture"]
    for name, check in zip(names, checks, strict=True):
        t0 = time.perf_counter()
        try:
            rs = check()
        except Exception as e:  # noqa: BLE001 - report and go on
            import traceback

            rs = {"check": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                  "where": traceback.format_exc()[-1500:]}
        for r in rs if isinstance(rs, list) else [rs]:
            r.setdefault("seconds_check", round(time.perf_counter() - t0, 2))
            ok &= bool(r.get("ok"))
            print(json.dumps(r, default=str), flush=True)
    try:
        pack(out)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"check": "pack", "ok": False, "error": str(e)}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
