"""Quantization on the default model (SmolLM2-135M-Instruct, a Q4_1 GGUF): int4 asymmetric g32 gives
back every Q4_1 matrix exactly, the file's blocks kept (its default) give the same logits as int4 on
its dequantized weights, and the quantized engines still answer (greedy, bf16 embeddings)."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams

pytestmark = pytest.mark.default_model


@pytest.fixture(scope="module")
def folder():
    from ridgeline.models.resolve import resolve_model
    return resolve_model("smollm2-135m", progress=False)


def test_int4_g32_reproduces_the_files_q4_1_matrices_exactly(folder):
    from safetensors import safe_open
    from ridgeline.formats import rtn
    exact = []
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                if name.endswith("proj.weight"):  # the file's Q4_1 tensors (its embedding is Q8_0)
                    w = f.get_tensor(name)
                    exact.append(torch.equal(rtn.quantize_int4(w, 32, False).dequantize(), w))
    assert len(exact) == 210 and all(exact)


def test_w4a8_keeps_the_files_grids_and_costs_under_half_a_percent(folder):
    """w4a8 on the default model is its kept Q4_1 blocks (int4 g32 on their values, above) with a
    Q8_0-grid head (w8a8-g32 on the embedding's Q8_0 values), both against int8 activations: its
    perplexity stays within +0.5% of the float model's (llama.cpp pays +0.3% for its Q8
    activations); one activation scale per whole row cost over +4%."""
    from safetensors import safe_open
    from ridgeline.engine.run import start_engine
    from ridgeline.eval.harness import Evaluator, Setting
    from ridgeline.kernels import cpu_quant
    from ridgeline.formats import rtn
    embs = []
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            embs += [f.get_tensor(n) for n in f.keys() if n == "model.embed_tokens.weight"]
    assert len(embs) == 1 and torch.equal(rtn.quantize_int8_g32(embs[0]).dequantize(), embs[0])
    if not cpu_quant.available("w4a8"):
        pytest.skip("no AVX512-VNNI kernels on this CPU")

    def make(options):
        return start_engine("smollm2-135m", dtype="bfloat16", kv_cache_memory="64MiB", max_model_len=1024,
                            progress=False, **options)
    ev = Evaluator(make, {"quantization": "none"}, window=512, max_tokens=2048, prompts=0, progress=False)
    ref = ev.start()
    got = ev.measure(Setting("w4a8", {"quantization": "w4a8"}))
    assert got.weight_formats == "w4a8 x 120, w8a8-g32 x 1"
    assert 0 < got.perplexity / ref.perplexity - 1 < 0.005, (ref.perplexity, got.perplexity)


def test_kept_blocks_give_the_logits_of_int4_on_the_dequantized_weights():
    from test_quant_engine import _logits
    kw = dict(dtype="bfloat16", kv_cache_memory="64MiB", max_model_len=1024, progress=False)
    kept = LLM("smollm2-135m", **kw)  # a .gguf model keeps its blocks unless told otherwise
    assert kept.info.quantization == "gguf"
    assert kept.info.weight_formats == "Q4_1 kept (int4) x 120, Q8_0 kept (int8-g32) x 1"
    assert "layers     layers 0-29: C decoder stack" in kept.info.summary() or not kept.info.kernel_plan.c_stack
    want = _logits(kept)
    del kept
    rtn = LLM("smollm2-135m", quantization="int4", layer_formats=[("lm_head", "int8-g32")], **kw)
    assert torch.equal(_logits(rtn), want)


@pytest.mark.parametrize("quantization", ["int8", "int4", "gguf"])
def test_quantized_default_model_answers_paris(quantization):
    llm = LLM("smollm2-135m", dtype="bfloat16", kv_cache_memory="256MiB", max_model_len=1024,
              quantization=quantization, progress=False)
    assert llm.info.weight_formats == {"int8": "int8 x 121", "int4": "int4 x 120, int8 x 1",
                                       "gguf": "Q4_1 kept (int4) x 120, Q8_0 kept (int8-g32) x 1"}[quantization]
    assert all(p is None for p in llm.info.layer_paths) or not llm.info.kernel_plan.c_stack
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text
