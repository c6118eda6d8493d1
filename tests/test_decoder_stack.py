"""The C decoder stack (kernels/decoder_stack.c) gives bitwise the same results as the modules it
replaces, for every supported architecture (qkv bias, sliding window), fp32 and bf16 weights,
prefill chunks mixed with decodes."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.kernels import cpu_gemm
from ridgeline.kernels.cpu_stack import DecoderStack

PROMPTS = ["Once upon a time", "The meaning of life is " * 6, "x", "abcdefghijklmnopqrstuvwxyz" * 3]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stack_equals_the_module_path(tiny_model, dtype, monkeypatch):
    if not cpu_gemm.available(getattr(torch, dtype)):
        pytest.skip(f"this CPU has no packed {dtype} kernel, so no C stack")
    _, folder = tiny_model
    # a small token budget splits prompts into chunks that share steps with other requests' decodes
    llm = LLM(str(folder), dtype=dtype, kv_cache_memory="4MiB", max_num_batched_tokens=24, enable_prefix_caching=False)
    model = llm.engine.runner.model.model
    assert llm.engine.runner.c_stack and model.stack is not None
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)

    def run():
        return [(c.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs])
                for o in llm.generate(PROMPTS, params, use_tqdm=False) for c in o.outputs]

    calls = []
    real = DecoderStack.__call__
    monkeypatch.setattr(DecoderStack, "__call__", lambda self, *a: calls.append(a[0].shape[0]) or real(self, *a))
    with_stack = run()
    assert len(calls) > 24 and max(calls) > 4  # every step, prefill chunks included
    stack, model.stack = model.stack, None
    modules = run()
    assert with_stack == modules  # token ids and logprobs, exactly
    model.stack = stack
    assert run() == with_stack
