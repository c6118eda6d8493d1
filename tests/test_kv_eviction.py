"""KV eviction (lossy, opt-in): the policies keep the sinks and the recent window (exact positions),
the moves keep slots dense, memory stays within the budget, a budget >= the sequence changes nothing,
and streaming decodes exactly as the model with the matching attention mask."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tiny_model
from ridgeline import LLM, SamplingParams
from ridgeline.config import CacheConfig
from ridgeline.engine.kv_eviction import Evictor, h2o_victims, streaming_victims
from ridgeline.errors import InvalidRequestError
from tests.test_hf_parity import hf_model

BS = 4


def test_streaming_evicts_the_oldest_after_the_sinks():
    pos = np.array([0, 1, 2, 3, 9, 5, 6, 7, 8, 4])  # slot order need not be position order
    assert sorted(pos[streaming_victims(pos, np.zeros(10), 3, 2, 8)].tolist()) == [2, 3, 4]
    assert sorted(pos[streaming_victims(pos, np.zeros(10), 2, 4, 8)].tolist()) == [4, 5]


def test_h2o_keeps_sinks_recent_half_and_heavy_hitters():
    pos = np.arange(20)
    score = np.zeros(20)
    score[[1, 6, 9]] = 5.0  # heavy hitters; 1 is a sink anyway
    gone = h2o_victims(pos, score, 8, 2, 16)  # recent: (16 - 2) // 2 = 7 newest (13..19)
    kept = sorted(set(range(20)) - set(pos[gone].tolist()))
    assert kept == [0, 1, 6, 9] + list(range(12, 20))
    assert not {0, 1} & set(gone.tolist()) and not set(range(13, 20)) & set(gone.tolist())


def _replay(ev: Evictor, rid: str, steps: list[int]) -> list[int]:
    """Run prepare() over steps of n tokens, keeping a model of slot contents (the position each holds)
    updated by the returned moves and writes; returns the positions held, in slot order."""
    k = ev.kept.get(rid)
    slots: list[int] = [] if k is None else k.pos.tolist()
    start = max(slots) + 1 if slots else 0
    for n in steps:
        held, moves = ev.prepare(rid, start, n)
        for a, b in moves:
            assert b < held <= a, "moves go from the tail into holes"
            slots[b] = slots[a]
        slots = slots[:held] + list(range(start, start + n))
        assert slots == ev.kept[rid].pos.tolist() and len(slots) <= ev.budget
        start += n
    return slots


def test_streaming_keeps_sinks_and_recent_window_exactly():
    ev = Evictor("streaming", budget=12, sinks=3)
    held = _replay(ev, "r", [5, 4, 1, 1, 1, 1, 1, 1, 1])  # 16 tokens, one at a time past the budget
    assert sorted(held) == [0, 1, 2] + list(range(7, 16))
    assert ev.evicted == 16 - 12


def test_prefill_chunks_are_capped_once_eviction_starts():
    ev = Evictor("streaming", budget=64, sinks=4)
    assert ev.max_new == (64 - 4) // 8
    assert ev.cap("r", 40) == 40  # fits without evicting
    _replay(ev, "r", [40])
    assert ev.cap("r", 40) == 24  # the room left
    _replay(ev, "r", [24])
    assert ev.cap("r", 40) == ev.max_new
    held = _replay(Evictor("streaming", 64, 4), "s", [40, 24, 7, 7, 7])
    assert sorted(held) == [0, 1, 2, 3] + list(range(85 - 60, 85))


def test_h2o_follows_observed_attention():
    ev = Evictor("h2o", budget=10, sinks=1)
    ev.prepare("r", 0, 10)
    ev.observe("r", np.array([9, 0, 0, 7, 0, 0, 0, 0, 0, 0.0]))  # position 3 is a heavy hitter
    held, _ = ev.prepare("r", 10, 1)
    assert 3 in ev.kept["r"].pos.tolist() and 0 in ev.kept["r"].pos.tolist() and held == 9
    assert 1 not in ev.kept["r"].pos.tolist()  # the oldest of the lightest


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("evict-llama"), "llama", seed=7)


def _llm(folder, **kw):
    opts = dict(dtype="float32", kv_cache_memory="1MiB", block_size=BS, progress=False)
    return LLM(str(folder), **{**opts, **kw})


PROMPTS = ["The quick brown fox jumps over the lazy dog", "a", "0123456789"]
GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)


@pytest.mark.parametrize("policy", ["streaming", "h2o"])
def test_budget_above_the_sequence_changes_nothing(llama, policy):
    want = [o.outputs[0].token_ids for o in _llm(llama).generate(PROMPTS, GREEDY, use_tqdm=False)]
    llm = _llm(llama, kv_eviction=policy, kv_eviction_budget=128)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert got == want and llm.engine.scheduler.evictor.evicted == 0


@pytest.mark.parametrize("policy", ["streaming", "h2o"])
def test_memory_stays_within_the_budget(llama, policy):
    budget = 20
    llm = _llm(llama, kv_eviction=policy, kv_eviction_budget=budget, max_num_batched_tokens=16)
    eng = llm.engine
    assert not eng.kv.caching and not eng.info.prefix_caching  # evicted blocks never enter the cache
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, GREEDY)
    done = 0
    while eng.has_unfinished():
        done += sum(o.finished for o in eng.step(emit_unfinished=False))
        eng.kv.check_integrity()
        for r in eng.scheduler.running:
            assert len(eng.kv.tables[r.request_id]) <= -(-budget // BS)
            assert eng.scheduler.evictor.held(r.request_id) <= budget
    assert done == 3 and eng.scheduler.evictor.evicted > 0
    assert eng.kv.num_used_blocks == 0 and not eng.scheduler.evictor.kept
    assert eng.info.tokens_per_request == 20


def test_streaming_decodes_as_the_model_with_the_streaming_mask(llama):
    """Prompt within the budget, then one token per step past it: query p attends the sinks and the
    budget - sinks most recent positions up to itself, which transformers reproduces with a 4D mask."""
    budget, sinks = 16, 3
    llm = _llm(llama, kv_eviction="streaming", kv_eviction_budget=budget, kv_sink_tokens=sinks)
    prompt = llm.tokenizer.encode("Hello there")
    out = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    seq = prompt + out
    T = len(seq)
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for p in range(budget, T):
        allowed[p, sinks:p - budget + 1 + sinks] = False
    with torch.no_grad():
        logits = hf_model(llama)(torch.tensor([seq]), attention_mask=allowed[None, None]).logits[0]
    assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == out
    assert llm.engine.scheduler.evictor.evicted == T - 1 - budget


@pytest.mark.parametrize("kw,why", [
    ({"kv_eviction": "streaming", "kv_eviction_budget": 7, "kv_sink_tokens": 4}, "must hold the 4 sink tokens"),
    ({"kv_eviction": "lru"}, "kv_eviction must be one of"),
    ({"kv_eviction": "h2o", "kv_sink_tokens": -1}, "kv_sink_tokens must be >= 0"),
])
def test_bad_eviction_settings(kw, why):
    with pytest.raises(InvalidRequestError, match=why):
        CacheConfig(block_size=4, **kw)


def test_eviction_refuses_what_it_cannot_combine_with(llama, tmp_path):
    with pytest.raises(InvalidRequestError, match="speculative decoding"):
        _llm(llama, kv_eviction="streaming", speculative_method="ngram")
    with pytest.raises(InvalidRequestError, match="h2o runs its own attention backend"):
        _llm(llama, kv_eviction="h2o", attention_backend="sdpa")
    mistral = make_tiny_model(tmp_path / "m", "mistral", sliding_window=8)
    with pytest.raises(InvalidRequestError, match="sliding-window model"):
        _llm(mistral, kv_eviction="streaming")


def test_cli_flags_reach_the_cache_config():
    import argparse
    from ridgeline.cli import add_engine_args, engine_kwargs
    from ridgeline.config import EngineConfig
    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = p.parse_args(["--kv-eviction", "h2o", "--kv-eviction-budget", "512", "--kv-sink-tokens", "8"])
    cc = EngineConfig.from_kwargs(**engine_kwargs(args)).cache
    assert (cc.kv_eviction, cc.kv_eviction_budget, cc.kv_sink_tokens) == ("h2o", 512, 8)
