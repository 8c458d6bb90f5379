"""verl's rollout server, as its ``vLLMHttpServer`` runs it, driven as verl's trainer drives it.

One process holds an ``AsyncLLM`` (vLLM's CPU build, the tiny dummy-weight Llama of
``live_vllm.py``) and vLLM's own HTTP app around it (``build_app`` / ``init_app_state`` on
uvicorn), as verl's ``run_server`` does. Then, twice, the calls verl makes: ``await
engine.start_profile()``, requests, ``await engine.stop_profile()``, and at once verl's
relocation (every file of the replica's trace directory moved up with a replica prefix,
``shutil.move``). The second stop's write is held (a FIFO at the worker's flushing marker, as
a disk that stopped answering): requests sent while the stop waits must complete before it
returns. Finally the trace directory's disk is filled past ``stepscope.min_free_disk_mb`` and
a start is tried over HTTP and through ``AsyncLLM``: both must be refused naming the key, and
the engine must go on serving.

Usage: ``python verl_rollout.py WORKDIR TRACE_DIR SAVE_PATH RESULT_JSON`` (TRACE_DIR on a small
tmpfs the caller mounted; the environment as ``live_vllm.VllmServer`` sets it). Writes what it
saw to RESULT_JSON; the assertions are the test's (``test_vllm_live_verl.py``), except the
ones that need the process's objects (a stop that returned while held).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from live_vllm import MODEL_CONFIG, free_port  # noqa: E402

#: The disk space a start needs here: ``stepscope.min_free_disk_mb`` as the test sets it.
MIN_FREE_MB = json.loads(os.environ["STEPSCOPE_CONFIG"])["stepscope"]["min_free_disk_mb"]
#: The line printed before the refusals, which are logged as errors by vLLM.
REFUSALS_BEGIN = "== the refusals begin"


class WriteHeld:
    """Holds the trace writes of the worker process ``pid`` at their first step: a FIFO at its
    flushing marker (``$TMPDIR/stepscope-flushing-{pid}``), which its writer thread writes
    before it finalizes a capture. Opening a FIFO to write blocks until a reader comes: the
    write waits, as on a disk that stopped answering, while the engine thread goes on."""

    def __init__(self, pid: int) -> None:
        self.path = Path(os.environ["TMPDIR"]) / f"stepscope-flushing-{pid}"
        os.mkfifo(self.path)

    def release(self) -> bytes:
        """Reads what the held writer writes (the marker's text), which lets it go on."""
        with open(self.path, "rb") as f:  # blocks until the writer has opened it
            got = f.read()
        if self.path.exists() and not self.path.is_file():
            self.path.unlink()
        return got


def room(path: Path) -> int:
    """Bytes free for this process on the filesystem of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def relocate(src: Path, dst: Path, prefix: str) -> list[str]:
    """verl's ``relocate_rollout_traces``: every entry of the replica's directory moved into
    ``save_path`` with the replica prefix, at once after the stop returns."""
    moved = []
    for name in sorted(os.listdir(src)):
        shutil.move(str(src / name), str(dst / (prefix + name)))
        moved.append(prefix + name)
    return moved


def http(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method=method,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw or b"null")
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")


async def main(workdir: Path, trace_dir: Path, save_path: Path, result_path: Path) -> None:
    import uvicorn
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.openai.api_server import build_app, init_app_state
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM

    import stepscope

    model = workdir / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    profiler_config = {"profiler": "torch", "torch_profiler_dir": str(trace_dir)}
    args = make_arg_parser(FlexibleArgumentParser()).parse_args([
        "--model", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
        "--max-model-len", "512", "--enforce-eager", "--host", "127.0.0.1",
        "--profiler-config", json.dumps(profiler_config),
    ])  # fmt: skip
    usage = UsageContext.OPENAI_API_SERVER
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=usage)
    engine = AsyncLLM.from_vllm_config(vllm_config=vllm_config, usage_context=usage)
    tasks = await engine.get_supported_tasks()
    app = build_app(args, supported_tasks=tasks, model_config=engine.model_config)
    await init_app_state(engine, app.state, args, tasks)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)

    count = 0

    async def generate(tokens: int, prompt_len: int = 8) -> int:
        nonlocal count
        count += 1
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
        prompt = {"prompt_token_ids": [3 + (count * 7 + k) % 500 for k in range(prompt_len)]}
        last = None
        async for output in engine.generate(prompt, params, request_id=f"req-{count}"):
            last = output
        assert last is not None and last.finished
        out = last
        return len(out.outputs[0].token_ids)

    result: dict[str, Any] = {"sessions": [], "port": port}
    for session in (1, 2):
        await engine.start_profile()
        await asyncio.gather(*(generate(8) for _ in range(3)))
        record: dict[str, Any] = {}
        if session == 2:
            (worker,) = await engine.collective_rpc("stepscope_status")
            held = WriteHeld(worker["pid"])
            stop = asyncio.create_task(engine.stop_profile())
            # The stop has reached the worker: its trace is queued, and held.
            while not any(
                t["status"] == "writing"
                for w in await engine.collective_rpc("stepscope_writes")
                for t in w.get("traces", [])
            ):
                await asyncio.sleep(0.01)
            # The stop cannot return while its write is held; requests sent now must be
            # served, one after another, meanwhile.
            served = [await generate(4) for _ in range(3)]
            record["served_while_the_stop_waited"] = served
            record["stop_returned_while_held"] = stop.done()
            began = time.perf_counter()
            record["held_marker"] = (await asyncio.to_thread(held.release)).decode()
            await stop
            record["stop_after_release_s"] = time.perf_counter() - began
        else:
            began = time.perf_counter()
            await engine.stop_profile()
            record["stop_s"] = time.perf_counter() - began
        # What verl's trainer does at once: move every file of the replica's directory.
        record["at_stop"] = sorted(os.listdir(trace_dir))
        record["moved"] = relocate(trace_dir, save_path, "rollout-replica0_")
        result["sessions"].append(record)

    # Relocated pairs read back through the library: complete, and each manifest finds its
    # trace under its new name.
    pairs = []
    for name in sorted(os.listdir(save_path)):
        if name.endswith(stepscope.MANIFEST_SUFFIX):
            m = stepscope.read_manifest(save_path / name)
            pairs.append({
                "manifest": name, "status": m["status"],
                "trace": os.path.basename(stepscope.manifest_trace_path(save_path / name)),
            })  # fmt: skip
    result["pairs"] = pairs

    # A full disk: a start is refused, over HTTP and through AsyncLLM, naming the key (and
    # logged as such: the log before this line holds no failure).
    print(REFUSALS_BEGIN, flush=True)
    free = room(trace_dir)
    filler = trace_dir / "filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        for _ in range(max(0, (free >> 20) - MIN_FREE_MB // 2)):
            f.write(chunk)
    # The server runs on this event loop: the client must not block it.
    result["refused_http"] = await asyncio.to_thread(http, port, "POST", "/start_profile")
    try:
        await engine.start_profile()
        result["refused_engine"] = None
    except stepscope.StartRefused as e:
        result["refused_engine"] = {"type": type(e).__name__, "key": e.key, "message": str(e)}
    # The engine goes on: a request after the refusals, over HTTP too.
    result["served_after_refusal"] = await generate(4)
    result["completion_after_refusal"] = (await asyncio.to_thread(
        http, port, "POST", "/v1/completions",
        {"model": str(model), "prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True},
    ))[0]  # fmt: skip
    filler.unlink()
    # Room again: a session starts and stops (with its trace on disk) as before. Its traces'
    # size goes with its length (the log says both, for a disk that proves too small).
    print(f"== room for the last session: {room(trace_dir) >> 20} MB", flush=True)
    began = time.perf_counter()
    await engine.start_profile()
    await generate(2)
    await engine.stop_profile()
    sizes = {name: (trace_dir / name).stat().st_size for name in os.listdir(trace_dir)}
    print(f"== the last session: {time.perf_counter() - began:.1f} s, files {sizes}", flush=True)
    result["after_room"] = sorted(sizes)

    server.should_exit = True
    await serving
    engine.shutdown()
    result_path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    workdir, trace_dir, save_path, result_path = (Path(a) for a in sys.argv[1:5])
    asyncio.run(main(workdir, trace_dir, save_path, result_path))
