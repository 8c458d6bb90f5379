"""A vLLM general plugin for the live slow-step and diff tests: the model ``SlowStepLlama``,
vLLM's own ``LlamaForCausalLM`` whose forward pass sleeps once when a prompt's first token is
``MARK``; and ``DelayableLlama``, whose every forward pass sleeps, inside a ``record_function``
range named ``DELAY_RANGE``, for ``DELAY_FACTOR`` times the median period of its forward passes
before, while the file named by ``STEPSCOPE_TEST_DELAY_FILE`` exists (a regression switched on
in a live server); and ``TokenCostLlama``, whose every forward pass sleeps ``TOKEN_COST_S`` per
token it computes (a step's time grows with its tokens by construction, for the request log's
attribution test).

The sleep is 400 times the median period of the forward passes before it, as this process
measured them, so the marked request's prefill is a clear outlier whatever the CPU's speed
(a 100x faster or slower machine scales both), and far above what a loaded machine makes of
an ordinary step (one step of a fresh `make test`, nine test processes at once on two cores,
took 38 times the median). Loaded through vLLM's real plugin mechanism:
the test puts this directory on ``PYTHONPATH`` (its ``.dist-info`` declares the
``vllm.general_plugins`` entry point) and names ``slow_step`` in ``VLLM_PLUGINS``; the plugin
registers the architecture with vLLM's ``ModelRegistry`` in every vLLM process.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import deque

# A token id the test's prompts never hold elsewhere (they use 3..502 of a 512-token vocab).
MARK = 511
# The sleep, in medians of the forward passes' period (test_vllm_live_trigger.py's trigger is a
# quarter of it, 100x, well above the 38x a load spike was seen to make).
SLOW_FACTOR = 400
ARCH = "SlowStepLlama"
DELAYABLE_ARCH = "DelayableLlama"
# The record_function range the delay runs in, as the trace names it.
DELAY_RANGE = "stepscope_test_injected_delay"
# The delay, in median periods of the forward passes before it: steps several times as long,
# well beyond how far a run on a busy 2-core host wanders by itself (docs/diff.md).
DELAY_FACTOR = 4
TOKEN_COST_ARCH = "TokenCostLlama"
# TokenCostLlama's sleep per token of a forward pass, s: a step's time grows with its tokens
# by construction, beyond what the model computes (more, too, the more tokens). A chunk of 128
# tokens sleeps 0.26 s, long enough for requests sent meanwhile to reach the queue.
TOKEN_COST_S = 0.002


# With this variable naming a file, every worker step a stepscope capture is armed for also
# runs vLLM's own ``Worker.annotate_profile`` on the same ``SchedulerOutput``, detailed, and
# appends what it names the step to the file, with the step index stepscope gives it and
# vLLM's own view of each request in it: the oracle of the live floor and role tests.
ANNOTATIONS_ENV = "STEPSCOPE_TEST_ANNOTATIONS"


def register() -> None:
    import os

    from vllm import ModelRegistry

    for arch in (ARCH, DELAYABLE_ARCH, TOKEN_COST_ARCH):
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, f"stepscope_slow_step:{arch}")
    if os.environ.get(ANNOTATIONS_ENV):
        import logging

        from stepscope._imports import when_imported

        path = os.environ[ANNOTATIONS_ENV]
        when_imported(
            "vllm.v1.worker.gpu_worker",
            lambda module: _record_vllms_own_annotations(module, path),
            logging.getLogger(__name__),
            "no oracle",
        )


def _record_vllms_own_annotations(gpu_worker, path: str) -> None:
    import json
    from types import SimpleNamespace

    worker = gpu_worker.Worker
    if getattr(worker.execute_model, "_stepscope_oracle", False):
        return
    execute = worker.execute_model

    class Oracle:
        """vLLM's profiler as annotate_profile drives it, keeping the name it is given."""

        should_annotate = True

        def __init__(self) -> None:
            self.name = None

        def step(self) -> None:
            pass

        def annotate_context_manager(self, name):
            self.name = name
            return None

    def execute_model(self, scheduler_output, *args, **kwargs):
        profiler = getattr(self, "profiler", None)
        if getattr(profiler, "is_armed", False):
            # vLLM's own function, under stepscope's patch (which keeps it).
            patched = type(self).annotate_profile
            own = getattr(patched, "__stepscope_original__", patched)
            oracle = Oracle()
            stub = SimpleNamespace(
                profiler=oracle,
                vllm_config=SimpleNamespace(
                    profiler_config=SimpleNamespace(detailed_trace_annotation=True)
                ),
            )
            own(stub, scheduler_output)
            step = profiler.status()["step_index"] + 1
            # vLLM's own view of each request in the step: tokens scheduled, tokens computed
            # before, and whether vLLM counts it in its context phase.
            new = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
            cached = scheduler_output.scheduled_cached_reqs
            computed = dict(new)
            computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
            requests = {
                str(r): [n, computed.get(r, 0), r in new or cached.is_context_phase(r)]
                for r, n in scheduler_output.num_scheduled_tokens.items()
            }
            with open(path, "a") as f:
                f.write(json.dumps({"step": step, "name": oracle.name, "requests": requests}))
                f.write("\n")
        return execute(self, scheduler_output, *args, **kwargs)

    execute_model._stepscope_oracle = True
    worker.execute_model = execute_model


@functools.cache
def _model_class():
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class SlowStepLlama(LlamaForCausalLM):
        # vLLM passes the keyword arguments this signature names.
        def __init__(self, *, vllm_config, prefix: str = ""):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self._starts: deque[float] = deque(maxlen=17)

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            now = time.monotonic()
            self._starts.append(now)
            if input_ids is not None and bool(((input_ids == MARK) & (positions == 0)).any()):
                starts = list(self._starts)[:-1]
                periods = [b - a for a, b in zip(starts, starts[1:], strict=False)]
                median = statistics.median(periods) if periods else 0.01
                time.sleep(SLOW_FACTOR * median)
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    return SlowStepLlama


@functools.cache
def _delayable_class():
    import os

    import torch
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class DelayableLlama(LlamaForCausalLM):
        def __init__(self, *, vllm_config, prefix: str = ""):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self._starts: deque[float] = deque(maxlen=65)
            self._delay: float | None = None
            self._switch = os.environ.get("STEPSCOPE_TEST_DELAY_FILE", "")

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            if self._switch and os.path.exists(self._switch) and len(self._starts) > 1:
                if self._delay is None:
                    # Fixed at the first switch, from the periods before it: the same share of
                    # a step on a fast or a slow CPU.
                    starts = list(self._starts)
                    periods = [b - a for a, b in zip(starts, starts[1:], strict=False)]
                    self._delay = DELAY_FACTOR * statistics.median(periods)
                with torch.profiler.record_function(DELAY_RANGE):
                    time.sleep(self._delay)
            else:
                self._starts.append(time.monotonic())
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    return DelayableLlama


@functools.cache
def _token_cost_class():
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class TokenCostLlama(LlamaForCausalLM):
        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            tokens = input_ids.numel() if input_ids is not None else positions.numel()
            time.sleep(TOKEN_COST_S * tokens)
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    return TokenCostLlama


def __getattr__(name: str):
    # vLLM imports the classes lazily ("stepscope_slow_step:SlowStepLlama"), after its own
    # modules are importable in that process.
    if name == ARCH:
        return _model_class()
    if name == DELAYABLE_ARCH:
        return _delayable_class()
    if name == TOKEN_COST_ARCH:
        return _token_cost_class()
    raise AttributeError(name)
