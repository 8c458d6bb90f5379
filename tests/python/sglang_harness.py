"""A scheduler process as far as SGLang's profiler sees it, on CPU, for the SGLang plugin's
tests: SGLang's own ``load_plugins`` applies the plugin's hooks, SGLang's own ``publish``
installs its config (the device, which ``SGLANG_PROFILE_V2``'s manager reads), SGLang's
parallel state says TP rank 0 of one, and a one-process gloo group stands for the TP group.

:class:`Scheduler` does what SGLang's ``Scheduler.run_batch`` does around the profiler: count
the batch, call ``_profile_batch_predicate``, run the forward (here CPU matmuls). With
``own=True`` its manager is SGLang's own, unhooked: a subclass whose hooked methods are the
originals the hooks wrap (``__wrapped__``), for differential tests on the same inputs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

import stepscope.sglang as plugin

pm = importlib.import_module(plugin.MANAGER_MODULE)  # SGLang's scheduler-side modules: ~40 s
from sglang.srt.managers.io_struct import ProfileReq, ProfileReqType  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

P, D, M, I = ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.MIXED, ForwardMode.IDLE
#: The manager's methods the plugin hooks.
HOOKED = ("_profile", "_profile_batch_predicate", "_start_profile", "_stop_profile")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_published = False


def publish_config() -> None:
    """SGLang's process config, published with SGLang's own API as a scheduler publishes it
    (GPU 0, the first of its node)."""
    global _published
    if _published:
        return
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    rc.publish(ServerArgs(model_path="dummy", device="cpu"), role="scheduler",
               ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))  # fmt: skip
    _published = True


@contextlib.contextmanager
def scheduler_process():
    """Plugins loaded by SGLang, config published, TP rank 0 of one, a gloo group for SGLang's
    own barriers."""
    os.environ["SGLANG_PLUGINS"] = "stepscope"
    from sglang.srt import plugins

    plugins.load_plugins()
    publish_config()
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


def own_manager_class(rescue: Path | None = None) -> type:
    """SGLang's ``SchedulerProfilerManager`` without the plugin: its hooked methods replaced by
    the originals the hooks wrap.

    ``rescue``: where a running torch.profiler that SGLang's own ``_start_profile`` replaces
    without writing it (a by-stage window of one stage begun while another's runs) is written
    first, as ``{n}~{its file stem}.trace.json.gz``, so a test sees what that window held."""
    cls = pm.SchedulerProfilerManager
    originals = {name: getattr(cls, name).__wrapped__ for name in HOOKED}
    if rescue is not None:
        start = originals["_start_profile"]

        def _start_profile(self, stage=None):
            if self.profile_in_progress and self.torch_profiler is not None:
                self.torch_profiler.stop()
                prefix = self.profile_prefix + "-" if self.profile_prefix else ""
                rescue.mkdir(parents=True, exist_ok=True)
                n = len(list(rescue.iterdir()))
                name = f"{n:03d}~{prefix}{self.profile_id}-TP-0.trace.json.gz"
                self.torch_profiler.export_chrome_trace(str(rescue / name))
                self.torch_profiler = None
            return start(self, stage)

        originals["_start_profile"] = _start_profile
    return type("OwnSchedulerProfilerManager", (cls,), originals)


class Scheduler:
    """What SGLang's ``Scheduler.run_batch`` does around the profiler. ``mark_forwards``: each
    forward inside ``record_function("fwd#{n}")``, so a trace shows which forward passes it
    holds."""

    def __init__(
        self,
        *,
        own: bool = False,
        mark_forwards: bool = False,
        rescue: Path | None = None,
    ) -> None:
        self.forward_ct = 0
        cls = own_manager_class(rescue) if own else pm.SchedulerProfilerManager
        self.manager = cls(get_forward_ct=lambda: self.forward_ct)
        self.mark_forwards = mark_forwards
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
        members = [SimpleNamespace(rid=f"{self.forward_ct}.{i}") for i in range(reqs)]
        # As ScheduleBatch lays an extend batch out: a length per request, a mixed batch's
        # decoding requests (one token each) last (mix_with_running).
        new = reqs - decoding
        lens = [(tokens - decoding) // new + (i < (tokens - decoding) % new) for i in range(new)]
        batch = SimpleNamespace(
            forward_mode=mode,
            reqs=members,
            extend_num_tokens=tokens if mode.is_extend() else None,
            extend_lens=lens + [1] * decoding if mode.is_extend() else None,
            decoding_reqs=members[new:] if decoding else None,
            batch_size=lambda: reqs,
        )
        self.manager._profile_batch_predicate(batch)
        with contextlib.ExitStack() as stack:
            if self.mark_forwards:
                stack.enter_context(torch.profiler.record_function(f"fwd#{self.forward_ct}"))
            for _ in range(reqs):
                self.x = torch.mm(self.x, self.x).tanh()
