"""Expert placement: contiguous blocks, uneven where the ranks do not divide the experts (earlier
ranks take one more), and end to end on two ranks started by the engine (`expert_parallel_size=2`)
a tiny Mixtral with 5 experts (3 on rank 0, 2 on rank 1) matches the single-process engine."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model

from ridgeline.distributed.memory import resident_weight_bytes
from ridgeline.entrypoints.llm import LLM
from ridgeline.errors import InvalidRequestError
from ridgeline.distributed import expert_load
from ridgeline.distributed.expert_placement import ExpertPlacement, expert_blocks
from ridgeline.sampling_params import SamplingParams

KW = dict(dtype="float32", kv_cache_memory="4MiB", progress=False)
PROMPTS = [list(range(5, 41)), [7, 300, 12, 99, 250, 3, 3, 3, 180, 64, 17]]


def test_blocks_are_contiguous_and_as_even_as_the_counts_allow():
    assert expert_blocks(8, 2) == [(0, 4), (4, 8)]
    assert expert_blocks(6, 4) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert [b - a for a, b in expert_blocks(60, 8)] == [8, 8, 8, 8, 7, 7, 7, 7]  # Qwen1.5-MoE
    p = ExpertPlacement(6, 4, 2)
    assert list(p.local) == [4] and p.per_rank == 1 and p.first == 4 and p.sizes == [2, 2, 1, 1]
    assert [p.owner(e) for e in range(6)] == [0, 0, 1, 1, 2, 3] and p.owns(4) and not p.owns(5)
    with pytest.raises(InvalidRequestError, match="3 experts cannot be placed over 4 expert-parallel ranks"):
        ExpertPlacement(3, 4, 0)
    with pytest.raises(InvalidRequestError, match="rank 4 is outside a group of 4"):
        ExpertPlacement(8, 4, 4)


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("ep-five"), "mixtral", num_local_experts=5)


def test_uneven_placement_matches_one_process(five):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    one = LLM(str(five), **KW)
    want_logits = [one.engine.prompt_logits(p) for p in PROMPTS]
    want = [o.outputs[0].token_ids for o in one.generate(PROMPTS, params, use_tqdm=False)]
    one_bytes = resident_weight_bytes(one.engine.runner.model)
    expert = expert_load.sparse_layers(one.engine.runner.model)[0].expert_bytes()
    ep = LLM(str(five), expert_parallel_size=2, **KW)
    try:
        info = ep.info.expert_parallel
        assert [(a, b) for a, b, _, _ in info.ranks] == [(0, 3), (3, 5)]
        layers = 2
        assert info.weight_bytes(0) == one_bytes - 2 * layers * expert  # 3 of 5 experts in each layer
        assert info.weight_bytes(1) == one_bytes - 3 * layers * expert
        for p, w in zip(PROMPTS, want_logits):
            torch.testing.assert_close(ep.engine.prompt_logits(p), w, atol=1e-5, rtol=0)
        assert [o.outputs[0].token_ids for o in ep.generate(PROMPTS, params, use_tqdm=False)] == want
        s = expert_load.summarize(expert_load.sparse_layers(ep.engine.runner.model))
        loads = [m.load_counts.tolist() for m in expert_load.sparse_layers(ep.engine.runner.model)]
        assert s["rank_pairs"] == [sum(sum(c[:3]) for c in loads), sum(sum(c[3:]) for c in loads)]
        assert sum(s["rank_pairs"]) == s["pairs"] > 0
    finally:
        ep.engine.close()
