"""The C decoder stack (kernels/decoder_stack.c) is a declared backend: it gives bitwise the same
results as the modules it replaces (every supported architecture, fp32 and bf16 weights, prefill
chunks mixed with decodes), over any layer range, with no-op hooks and hidden-state capture, and
for a mix of per-layer weight formats; the layers it cannot run are named with the reason."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.step_plan import ScheduledSeq
from ridgeline.kernels import cpu_gemm
from ridgeline.layers.forward_context import forward_context
from ridgeline.models.decoder_stack import CStack
from conftest import make_tiny_model

PROMPTS = ["Once upon a time", "The meaning of life is " * 6, "x", "abcdefghijklmnopqrstuvwxyz" * 3]


def _modules_only(model):
    return [(0, len(model.layers), False)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stack_equals_the_module_path(tiny_model, dtype, monkeypatch):
    if not cpu_gemm.available(getattr(torch, dtype)):
        pytest.skip(f"this CPU has no packed {dtype} kernel, so no C stack")
    _, folder = tiny_model
    # a small token budget splits prompts into chunks that share steps with other requests' decodes
    llm = LLM(str(folder), dtype=dtype, kv_cache_memory="4MiB", max_num_batched_tokens=24, enable_prefix_caching=False)
    model = llm.engine.runner.model.model
    assert all(p is None for p in llm.info.layer_paths) and model.stack is not None
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)

    def run():
        return [(c.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs])
                for o in llm.generate(PROMPTS, params, use_tqdm=False) for c in o.outputs]

    calls = []
    real = CStack.__call__
    monkeypatch.setattr(CStack, "__call__", lambda self, *a, **k: calls.append(a[1].shape[0]) or real(self, *a, **k))
    with_stack = run()
    assert len(calls) > 24 and max(calls) > 4  # every step, prefill chunks included
    segments, model.segments = model.segments, _modules_only(model)
    modules = run()
    assert with_stack == modules  # token ids and logprobs, exactly
    model.segments = segments
    assert run() == with_stack


def _step(llm: LLM, prompts: list[list[int]]):
    """One prefill step over `prompts` (fresh KV blocks): (positions, forward context, kv request ids)."""
    runner, kv = llm.engine.runner, llm.engine.kv
    seqs = []
    for i, ids in enumerate(prompts):
        assert kv.allocate(f"s{i}", len(ids))
        seqs.append(ScheduledSeq(f"s{i}", 0, ids, list(kv.tables[f"s{i}"]), True, SamplingParams(), None, ids,
                                 len(ids)))
    ids, pos, ctx, _ = runner.prepare(seqs)
    return ids, pos, ctx, [s.req_id for s in seqs]


def _run(llm: LLM, prompts, fn):
    ids, pos, ctx, rids = _step(llm, prompts)
    try:
        with torch.inference_mode(), forward_context(ctx):
            return fn(llm.engine.runner.model.model, ids, pos)
    finally:
        for r in rids:
            llm.engine.kv.free(r)


@pytest.fixture(scope="module")
def deep_llm(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("deep"), "qwen2", num_hidden_layers=5)
    return LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False)


PROMPT_IDS = [[5, 9, 33, 120, 7, 7, 8], [200, 3], list(range(40, 80))]


def test_layer_ranges_hooks_and_capture_are_bitwise_the_whole_stack(deep_llm):
    L = 5
    whole = _run(deep_llm, PROMPT_IDS, lambda m, ids, pos: m(ids, pos))

    def split(at):
        def fn(m, ids, pos):
            h, r, _ = m.run_layers(pos, m.embed(ids), None, 0, at)
            return m.run_layers(pos, h, r, at, L, final_norm=True)[0]
        return fn

    for at in (0, 1, 3, L):
        assert torch.equal(_run(deep_llm, PROMPT_IDS, split(at)), whole), f"split at {at}"
    calls = []

    def no_op(m, ids, pos):
        return m.run_layers(pos, m.embed(ids), None, 0, L, final_norm=True,
                            hook=lambda layer, where, x: calls.append((layer, where, tuple(x.shape))),
                            capture=[0, 2, 4])

    out, _, captured = _run(deep_llm, PROMPT_IDS, no_op)
    assert torch.equal(out, whole)
    T = sum(map(len, PROMPT_IDS))
    assert calls == [(layer, where, (T, 64)) for layer in range(L) for where in (0, 1)]
    model = deep_llm.engine.runner.model.model
    segments, model.segments = model.segments, _modules_only(model)
    try:
        out_m, _, captured_m = _run(deep_llm, PROMPT_IDS, no_op)
    finally:
        model.segments = segments
    assert torch.equal(out_m, whole) and sorted(captured) == sorted(captured_m) == [0, 2, 4]
    for layer in captured:
        assert torch.equal(captured[layer], captured_m[layer])

    def scaled(m, ids, pos):  # a hook that changes the data changes the output, in C and in modules alike
        def hook(layer, where, x):
            if layer == 2 and where == 1:
                x.mul_(0.5)
        return m.run_layers(pos, m.embed(ids), None, 0, L, final_norm=True, hook=hook)[0]

    changed = _run(deep_llm, PROMPT_IDS, scaled)
    model.segments = _modules_only(model)
    try:
        assert torch.equal(_run(deep_llm, PROMPT_IDS, scaled), changed) and not torch.equal(changed, whole)
    finally:
        model.segments = segments


def _generate(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for o in llm.generate(PROMPTS, params, use_tqdm=False)
            for c in o.outputs]


def _equals_module_path(llm):
    got = _generate(llm)
    model = llm.engine.runner.model.model
    segments, model.segments = model.segments, _modules_only(model)
    try:
        assert got == _generate(llm)
    finally:
        model.segments = segments


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("three"), "llama", num_hidden_layers=3)


def test_mixed_weight_formats_all_run_in_the_stack(three_layers):
    llm = LLM(str(three_layers), dtype="float32", kv_cache_memory="4MiB", progress=False,
              layer_formats=[("model.layers.1.*", "bf16")])
    layers = llm.engine.runner.model.model.layers
    assert layers[1].mlp.down_proj.format.name == "bf16" and layers[0].mlp.down_proj.format.name == "f32"
    if llm.info.kernel_plan.c_stack and cpu_gemm.available(torch.bfloat16):
        assert llm.info.layer_paths == (None, None, None)  # fp32 and bf16 layers in one C call
    _equals_module_path(llm)


def test_quantized_layers_mix_with_dense_ones_in_the_stack(three_layers):
    from ridgeline.kernels import cpu_quant
    llm = LLM(str(three_layers), dtype="bfloat16", kv_cache_memory="4MiB", progress=False,
              layer_formats=[("model.layers.0.*", "int8"), ("model.layers.1.*", "int4-sym-g64"),
                             ("lm_head", "int4")])
    model = llm.engine.runner.model
    layers = model.model.layers
    assert [layers[i].mlp.down_proj.format.name for i in range(3)] == ["int8", "int4-sym-g64", "bf16"]
    assert model.lm_head.format.name == "int4"
    if llm.info.kernel_plan.c_stack and cpu_quant.available("int8") and cpu_quant.available("int4"):
        assert llm.info.layer_paths == (None, None, None)  # int8, int4 and bf16 layers in one C call
    _equals_module_path(llm)


def test_a_layer_the_stack_cannot_run_is_named_and_runs_as_modules(three_layers):
    llm = LLM(str(three_layers), dtype="float32", kv_cache_memory="4MiB", progress=False,
              layer_formats=[("model.layers.1.*", "f16")])  # no C kernel reads fp16 weights
    info = llm.info
    assert "model.layers.1.self_attn.qkv_proj" in info.layer_paths[1]
    if info.kernel_plan.c_stack:  # the step goes C, modules, C
        assert info.layer_paths[0] is None and info.layer_paths[2] is None
        assert "layer 1: modules (model.layers.1.self_attn.qkv_proj: f16 weight" in info.summary()
        assert llm.engine.runner.model.model.segments == [(0, 1, True), (1, 2, False), (2, 3, True)]
    _equals_module_path(llm)


def test_unknown_layer_format_is_a_clear_error(tiny_llama):
    from ridgeline.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="unknown weight format 'int3'"):
        LLM(str(tiny_llama), dtype="float32", kv_cache_memory="4MiB", progress=False,
            layer_formats=[("model.layers.0.*", "int3")])


def test_two_engines_in_one_process_keep_their_own_kernels(tiny_llama):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)

    def out(llm):
        return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for o in llm.generate(PROMPTS, params, use_tqdm=False)
                for c in o.outputs]

    a = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="4MiB", progress=False)
    alone_a = out(a)
    b = LLM(str(tiny_llama), dtype="bfloat16", kv_cache_memory="4MiB", progress=False)
    first_b = out(b)
    assert out(a) == alone_a  # building a bf16 engine changed nothing in the fp32 one
    assert a.info.kernel_plan is not b.info.kernel_plan
    del a
    assert out(b) == first_b
