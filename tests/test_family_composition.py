"""The non-Llama families with the engine's other techniques: lossless ones (n-gram and layer-skip
speculation, prefix caching, chunked prefill) give greedy output token for token the plain engine's with
the KV books balanced after every step; lossy ones (bf16, int8 / int4 weights, an int8 KV cache) run with the
layers still in the C stack and stay near the float logits; tensor parallelism matches one process."""
from __future__ import annotations

import pytest
import torch

from conftest import FAMILY_ARCHS, make_tiny_model
from ridgeline import LLM, SamplingParams
from ridgeline.kernels import cpu_gemm
from test_multi_token_steps import PROMPTS, _params, _run
from test_tensor_parallel import BOUND, _greedy_agree

BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)


@pytest.fixture(scope="module", params=FAMILY_ARCHS)
def family(request, tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp(f"comp-{request.param}"), request.param, num_hidden_layers=4)
    return request.param, folder, _run(LLM(str(folder), **BASE), _params())


@pytest.mark.parametrize("opts", [
    dict(speculative_method="ngram", num_speculative_tokens=3, speculative_controller="off"),
    dict(speculative_method="layer-skip", speculative_layers=2, num_speculative_tokens=3,
         speculative_controller="off"),
    dict(max_num_batched_tokens=7, enable_prefix_caching=False),
], ids=["ngram", "layer-skip", "chunked-no-prefix-cache"])
def test_lossless_techniques_keep_greedy_output(family, opts):
    arch, folder, plain = family
    llm = LLM(str(folder), **BASE, **opts)
    assert _run(llm, _params()) == plain
    if "speculative_method" in opts:
        assert llm.engine.spec_stats.proposed > 0


def test_prefix_cache_hits_keep_greedy_output(family):
    arch, folder, _ = family
    llm = LLM(str(folder), **BASE)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = PROMPTS[1] * 3
    first = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == first and (again.num_cached_tokens or 0) > 0


@pytest.mark.parametrize("opts,bound", [(dict(quantization="int8"), 0.05), (dict(quantization="int4"), 0.5),
                                        (dict(kv_cache_dtype="int8"), 0.05), (dict(dtype="bfloat16"), 0.05)],
                         ids=["int8", "int4", "kv-int8", "bf16"])
def test_lossy_formats_run_in_the_stack_near_the_float_logits(family, opts, bound):
    arch, folder, _ = family
    if opts.get("dtype") == "bfloat16" and not cpu_gemm.available(torch.bfloat16):
        pytest.skip("this CPU has no packed bf16 kernel, so no C stack for bf16 weights")
    ref, llm = LLM(str(folder), **BASE), LLM(str(folder), **{**BASE, **opts})
    assert all(p is None for p in llm.info.layer_paths)
    for p in PROMPTS[:3]:
        want, got = ref.engine.prompt_logits(p), llm.engine.prompt_logits(p)
        assert got.shape == want.shape
        assert ((got - want).norm() / want.norm()).item() < bound  # relative error of the logits


@pytest.mark.slow  # starts rank processes
def test_tensor_parallel_matches_one_process(family):
    arch, folder, _ = family
    kw = dict(dtype="float32", kv_cache_memory=8 << 20, progress=False)
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=2)
    ref = LLM(str(folder), **kw)
    want = [ref.engine.prompt_logits(p) for p in PROMPTS[:3]]
    want_out = ref.generate(PROMPTS[:3], params, use_tqdm=False)
    tp = LLM(str(folder), tensor_parallel_size=2, **kw)
    try:
        for p, w in zip(PROMPTS[:3], want):
            got = tp.engine.prompt_logits(p)
            assert got.shape == w.shape and (got - w).abs().max().item() < BOUND
        for a, b in zip(want_out, tp.generate(PROMPTS[:3], params, use_tqdm=False)):
            _greedy_agree(a, b)
    finally:
        tp.engine.close()
