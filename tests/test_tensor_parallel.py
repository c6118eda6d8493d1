"""Tensor parallelism on CPU with gloo, 2 processes: the sharding rules, parity with the single-process
engine (logits within a tight bound, greedy tokens equal wherever the top-2 margin exceeds it), each
rank's resident weight bytes, and a killed rank ending rank 0 with a clear error."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import make_tiny_model
from rank_kill import kill_rank_1
from ridgeline.distributed.layout import tp_layout
from ridgeline.distributed.memory import resident_weight_bytes
from ridgeline.distributed.shard import check_groups
from ridgeline.entrypoints.llm import LLM
from ridgeline.errors import InvalidRequestError
from ridgeline.layers.moe import SparseMoE
from ridgeline.layers.norm import RMSNorm
from ridgeline.sampling_params import SamplingParams

BOUND = 2e-3  # |logit difference| allowed: the row-parallel sums run in another order across ranks
SHAPES = {  # (architecture, overrides)
    # the default model's head layout: 9 query heads in 3 GQA groups -> 2 groups on rank 0, 1 on rank 1
    "llama-9-3": ("llama", dict(num_attention_heads=9, num_key_value_heads=3, hidden_size=144)),
    # every per-rank width a multiple of the packed GEMM's 48 columns: resident bytes split exactly
    "qwen2": ("qwen2", dict(hidden_size=192, num_attention_heads=4, num_key_value_heads=2, intermediate_size=384)),
    "qwen2_moe": ("qwen2_moe", {}),
}
PROMPTS = [list(range(5, 41)), [7, 300, 12, 99, 250, 3, 3, 3, 180, 64, 17]]


def test_layout_rules():
    r0, r1 = tp_layout(9, 3, 1536, 49152, 2)  # the default model
    assert (r0.heads, r0.kv_heads, r1.heads, r1.kv_heads) == ((0, 6), (0, 2), (6, 9), (2, 3))
    assert (r0.inter, r1.inter, r0.vocab, r1.vocab) == ((0, 768), (768, 1536), (0, 24576), (24576, 49152))
    a, b = tp_layout(4, 1, 64, 101, 2)  # fewer KV heads than ranks: replicated, query heads split
    assert a.kv_heads == b.kv_heads == (0, 1) and a.kv_replicated and (a.heads, b.heads) == ((0, 2), (2, 4))
    assert b.vocab == (51, 101) and b.vocab_chunk == 51  # the last chunk is padded to 51 rows
    with pytest.raises(InvalidRequestError, match="cannot split 3 KV heads"):
        tp_layout(9, 3, 1536, 49152, 4)
    with pytest.raises(InvalidRequestError, match="does not divide the MLP width"):
        tp_layout(8, 8, 100, 64, 3)
    check_groups([r0, r1], 64, 128)  # slices start on whole groups: 384 and 768 columns
    with pytest.raises(InvalidRequestError, match="inside a quantization group of 256"):
        check_groups([r0, r1], 64, 256)


def test_advisor_prices_the_engines_collectives():
    from ridgeline.advisor.parallel_comm import Link, tp_step_comm
    link = Link(latency=1e-4, bandwidth=1e9)
    t, n = tp_step_comm(30, 576, 49152, 2, tokens=1, sampled=1, link=link)
    assert n == 62  # 2 per layer + the embedding's all-reduce + the logits' all-gather
    assert t == pytest.approx(61 * (1e-4 + 576 * 4 / 1e9) + 1e-4 + 0.5 * 49152 * 4 / 1e9)
    assert tp_step_comm(30, 576, 49152, 1, 1, 1, link) == (0.0, 0)


def test_bad_parallel_options():
    with pytest.raises(InvalidRequestError, match="speculative decoding"):
        LLM("unused", tensor_parallel_size=2, speculative_method="ngram")
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size must be >= 1"):
        LLM("unused", tensor_parallel_size=0)


@pytest.fixture(scope="module", params=list(SHAPES))
def tiny(request, tmp_path_factory) -> tuple[str, Path]:
    arch, kw = SHAPES[request.param]
    return request.param, make_tiny_model(tmp_path_factory.mktemp(f"tp-{request.param}"), arch, **kw)


def _replicated_bytes(model) -> int:
    parts = [m.weight for m in model.modules() if isinstance(m, RMSNorm)]
    for m in model.modules():
        if isinstance(m, SparseMoE):
            parts += [m.gate.packed.data if m.gate.packed is not None else m.gate.weight]
            if m.shared_expert_gate is not None:
                g = m.shared_expert_gate
                parts += [g.packed.data if g.packed is not None else g.weight]
    return sum(p.numel() * p.element_size() for p in parts)


def _greedy_agree(ref_out, tp_out) -> None:
    """Tokens equal up to the first step whose reference top-2 margin is within twice the bound."""
    a, b = ref_out.outputs[0], tp_out.outputs[0]
    for i, tok in enumerate(a.token_ids):
        top = sorted((lp for _, lp in a.logprobs[i].top), reverse=True)
        if len(top) > 1 and top[0] - top[1] <= 2 * BOUND:
            return
        assert b.token_ids[i] == tok, f"step {i}: {b.token_ids} != {a.token_ids}"


@pytest.mark.slow  # starts rank / worker processes
def test_tp2_matches_one_process(tiny):
    name, folder = tiny
    kw = dict(dtype="float32", kv_cache_memory=8 << 20, progress=False)
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=2)
    ref = LLM(str(folder), **kw)
    want = [ref.engine.prompt_logits(p) for p in PROMPTS]
    want_out = ref.generate(PROMPTS, params, use_tqdm=False)
    total, replicated = resident_weight_bytes(ref.engine.runner.model), _replicated_bytes(ref.engine.runner.model)
    tp = LLM(str(folder), tensor_parallel_size=2, **kw)
    try:
        for p, w in zip(PROMPTS, want):
            got = tp.engine.prompt_logits(p)
            assert got.shape == w.shape and (got - w).abs().max().item() < BOUND
        for a, b in zip(want_out, tp.generate(PROMPTS, params, use_tqdm=False)):
            _greedy_agree(a, b)
        info = tp.info.tensor_parallel
        sizes = [info.weight_bytes(r) for r in range(2)]
        if name == "qwen2":  # even split: each rank holds half of what is split, all of what is replicated
            for s in sizes:
                assert abs(s - ((total - replicated) / 2 + replicated)) <= 0.005 * total, (sizes, total)
        else:
            assert max(sizes) < 0.75 * total and sum(sizes) < total + replicated + 0.05 * total, (sizes, total)
        if name == "llama-9-3":  # KV capacity follows the heads: rank 0 holds 2 KV heads, rank 1 one
            kv = [info.ranks[r][2] for r in range(2)]
            assert kv[0] == 2 * kv[1]
    finally:
        tp.engine.close()


@pytest.mark.slow  # starts rank / worker processes
def test_killed_rank_ends_rank0_with_clear_error(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tp-kill"), "llama")
    kill_rank_1(folder, "tensor_parallel_size", "tensor_parallel", "tensor-parallel rank 1")


def test_start_up_errors_before_any_rank_starts(tiny_llama, monkeypatch):
    folder = tiny_llama
    monkeypatch.setattr("ridgeline.distributed.runtime.os.sched_getaffinity", lambda pid: {0})
    with pytest.raises(InvalidRequestError, match="larger than the 1 CPU cores"):
        LLM(str(folder), tensor_parallel_size=2, progress=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(InvalidRequestError, match="WORLD_SIZE is 3 but tensor_parallel_size is 2"):
        LLM(str(folder), tensor_parallel_size=2, progress=False)


@pytest.mark.parametrize("how", ["close", "with", "collected"])
def test_two_tp_engines_one_after_the_other(tmp_path, how):
    """The first engine pins this process to its rank's cores and joins a process group; closing it,
    leaving its `with`, or letting it be collected gives both back, so a second one starts."""
    import gc
    folder = make_tiny_model(tmp_path, "llama")
    kw = dict(tensor_parallel_size=2, dtype="float32", kv_cache_memory=8 << 20, progress=False)
    params = SamplingParams(max_tokens=4, temperature=0)
    cores = os.sched_getaffinity(0)
    outs = []
    for _ in range(2):
        if how == "with":
            with LLM(str(folder), **kw) as llm:
                outs.append(llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids)
            continue
        llm = LLM(str(folder), **kw)
        outs.append(llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids)
        if how == "close":
            llm.close()
            llm.close()  # idempotent
        del llm
        gc.collect()
    assert outs[0] == outs[1] and len(outs[0]) == 4
    assert os.sched_getaffinity(0) == cores  # the pin is given back
