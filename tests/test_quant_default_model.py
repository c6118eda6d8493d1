"""Quantization on the default model (SmolLM2-135M-Instruct, a Q4_1 GGUF): int4 asymmetric g32 gives
back every Q4_1 matrix exactly, and the quantized engines still answer (greedy, bf16 embeddings)."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams

pytestmark = pytest.mark.default_model


@pytest.fixture(scope="module")
def folder():
    from ridgeline.weights.resolve import resolve_model
    return resolve_model("smollm2-135m", progress=False)


def test_int4_g32_reproduces_the_files_q4_1_matrices_exactly(folder):
    from safetensors import safe_open
    from ridgeline.quant import rtn
    exact = []
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                if name.endswith("proj.weight"):  # the file's Q4_1 tensors (its embedding is Q8_0)
                    w = f.get_tensor(name)
                    exact.append(torch.equal(rtn.quantize_int4(w, 32, False).dequantize(), w))
    assert len(exact) == 210 and all(exact)


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_default_model_answers_paris(quantization):
    llm = LLM("smollm2-135m", dtype="bfloat16", kv_cache_memory="256MiB", max_model_len=1024,
              quantization=quantization, progress=False)
    assert llm.info.weight_formats == ("int8 x 121" if quantization == "int8" else "int4 x 120, int8 x 1")
    assert all(p is None for p in llm.info.layer_paths) or not llm.info.kernel_plan.c_stack
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text
