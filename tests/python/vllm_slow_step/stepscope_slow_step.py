"""A vLLM general plugin for the live slow-step test: the model ``SlowStepLlama``, vLLM's own
``LlamaForCausalLM`` whose forward pass sleeps once when a prompt's first token is ``MARK``.

The sleep is 100 times the median period of the forward passes before it, as this process
measured them, so the marked request's prefill is a clear outlier whatever the CPU's speed
(a 100x faster or slower machine scales both). Loaded through vLLM's real plugin mechanism:
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
# The sleep, in medians of the forward passes' period.
SLOW_FACTOR = 100
ARCH = "SlowStepLlama"


def register() -> None:
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, "stepscope_slow_step:SlowStepLlama")


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


def __getattr__(name: str):
    # vLLM imports the class lazily ("stepscope_slow_step:SlowStepLlama"), after its own
    # modules are importable in that process.
    if name == "SlowStepLlama":
        return _model_class()
    raise AttributeError(name)
