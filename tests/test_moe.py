"""Qwen3 (per-head q/k norm) and the sparse-MLP models (Mixtral, Qwen2-MoE with its shared expert,
Qwen3-MoE) match transformers on the same tiny random weights: prefill logits (whole and chunked),
greedy tokens over a batch of mixed lengths; the C decoder stack equals the module path bit for bit;
the torch fallback agrees with the C kernel; router ties pick the experts transformers picks."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.layers.moe import SparseMoE
from conftest import make_tiny_model
from test_hf_parity import PROMPTS, assert_prefill_matches_transformers, engine_logits, hf_greedy, hf_model


def _llm(folder, **kw):
    return LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False, **kw)


def _sparse(llm) -> list[SparseMoE]:
    return [m for m in llm.engine.runner.model.modules() if isinstance(m, SparseMoE)]


@pytest.mark.parametrize("chunk", [1000, 5])
def test_prefill_logits_match_transformers(tiny_new_model, chunk):
    arch, folder = tiny_new_model
    llm = _llm(folder)
    assert all(p is None for p in llm.info.layer_paths)  # every layer in the C stack
    assert_prefill_matches_transformers(llm, folder, chunk)


@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": 7}], ids=["plain", "chunked"])
def test_greedy_matches_transformers(tiny_new_model, options):
    arch, folder = tiny_new_model
    llm = _llm(folder, **options)
    ref = hf_model(folder)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params, use_tqdm=False)):
        assert out.outputs[0].token_ids == hf_greedy(ref, llm.tokenizer.encode(prompt), 24), f"{arch}: {prompt!r}"
    llm.engine.kv.check_integrity()


def _generate(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
    return [(c.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs])
            for o in llm.generate(PROMPTS, params, use_tqdm=False) for c in o.outputs]


def test_stack_equals_module_path_and_torch_fallback_agrees(tiny_new_model, monkeypatch):
    arch, folder = tiny_new_model
    llm = _llm(folder, max_num_batched_tokens=24, enable_prefix_caching=False)
    model = llm.engine.runner.model.model
    assert model.stack is not None and model.segments == [(0, len(model.layers), True)]
    with_stack = _generate(llm)
    model.segments = [(0, len(model.layers), False)]
    assert _generate(llm) == with_stack  # modules call the same kernels: bitwise
    if arch == "qwen3":
        return
    monkeypatch.setattr(SparseMoE, "c_descriptor", lambda self: "forced torch path")
    torch_path = _generate(llm)
    for (ids_c, lps_c), (ids_t, lps_t) in zip(with_stack, torch_path):
        assert ids_c == ids_t
        for a, b in zip(lps_c, lps_t):
            assert abs(a[1] - b[1]) < 1e-4


def test_router_ties_pick_the_experts_transformers_picks(tmp_path):
    """A zero router makes every expert tie for every token: the chosen set is torch.topk's."""
    from safetensors.torch import load_file, save_file
    folder = make_tiny_model(tmp_path, "qwen3_moe", num_experts=8, num_experts_per_tok=3, norm_topk_prob=False)
    path = folder / "model.safetensors"
    state = load_file(path)
    state["model.layers.0.mlp.gate.weight"].zero_()
    save_file(state, path, metadata={"format": "pt"})
    llm = _llm(folder)
    ref = hf_model(folder)
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    for prompt_ids, got in zip(ids, engine_logits(llm, ids, 1000)):
        with torch.no_grad():
            want = ref(torch.tensor([prompt_ids])).logits[0]
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_expert_load_counts(tmp_path):
    folder = make_tiny_model(tmp_path, "qwen2_moe")
    llm = _llm(folder)
    moes = _sparse(llm)
    assert [m.index for m in moes] == [0]  # layer 1 is mlp_only
    before = moes[0].load_counts.clone()
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    engine_logits(llm, ids, 1000)
    routed = moes[0].load_counts - before
    assert int(routed.sum()) == sum(map(len, ids)) * moes[0].top_k
    assert (routed > 0).sum() > 1


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_experts_run_in_the_stack(tmp_path, quant):
    folder = make_tiny_model(tmp_path, "mixtral", hidden_size=128, intermediate_size=128)
    llm = _llm(folder, quantization=quant)
    assert all(p is None for p in llm.info.layer_paths)
    moe = _sparse(llm)[0]
    assert moe.experts[0].gate_up_proj.format.name.startswith(quant) and moe.gate.format.name == "f32"
    ids = [llm.tokenizer.encode(p) for p in PROMPTS[:2]]
    quantized = engine_logits(llm, ids, 1000)
    model = llm.engine.runner.model.model
    model.segments = [(0, len(model.layers), False)]
    assert all(torch.equal(a, b) for a, b in zip(engine_logits(llm, ids, 1000), quantized))
    for q, f in zip(quantized, engine_logits(_llm(folder), ids, 1000)):  # lossy, but close to the float model
        assert torch.nn.functional.cosine_similarity(q, f, dim=-1).mean() > 0.85
