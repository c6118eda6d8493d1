"""Sliding-window memory bounds: with a window on every layer, blocks behind it are freed as a request
moves on, so its blocks stay flat past the window; lossless (greedy output as transformers and as the
engine that keeps every block); the prefix cache keeps serving what it still holds."""
from __future__ import annotations

import pytest

from conftest import make_tiny_model
from ridgeline import LLM, SamplingParams
from ridgeline.engine.kv_manager import KVCacheManager
from tests.test_hf_parity import hf_greedy, hf_model

W, BS = 8, 4
GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("win-mistral"), "mistral", seed=5, sliding_window=W)


def _llm(folder, **kw):
    opts = dict(dtype="float32", kv_cache_memory="1MiB", block_size=BS, max_num_batched_tokens=6, progress=False)
    return LLM(str(folder), **{**opts, **kw})


def _held(eng, req) -> tuple:
    return eng.kv.held_blocks(req.request_id), req.num_computed_tokens


def _run_steps(llm, prompts, params=GREEDY, free_window=True, held_of=_held):
    """Step the engine by hand: check_integrity() after every step; returns (outputs by id, per step
    held_of(engine, request) by request id: the blocks it holds, with the tokens it had computed)."""
    eng = llm.engine
    if not free_window:
        eng.kv.windows = (None,)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    outs, held = {}, []
    while eng.has_unfinished():
        for o in eng.step(emit_unfinished=False):
            if o.finished:
                outs[o.request_id] = o
        eng.kv.check_integrity()
        held.append({r.request_id: held_of(eng, r) for r in eng.scheduler.running})
    eng.kv.check_integrity()
    assert eng.kv.num_used_blocks == 0
    return {k: outs[k].outputs[0].token_ids for k in sorted(outs)}, held


def _finish(eng):
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step(emit_unfinished=False) if o.finished]
    return outs


def test_blocks_stay_flat_past_the_window(mistral):
    llm = _llm(mistral, enable_prefix_caching=False)
    outs, held = _run_steps(llm, ["The quick brown fox jumps over the lazy dog"])
    decoding = [h["r0"][0] for h in held if "r0" in h and h["r0"][1] > 44]  # past the 43-token prompt
    assert len(decoding) > 30 and max(decoding) <= -(-W // BS) + 1  # ceil(W / block size) + 1
    prefill = [h["r0"][0] for h in held if "r0" in h]
    assert max(prefill) <= -(-(W - 1 + 6) // BS) + 1  # the window behind a chunk of 6, and the chunk
    ref = hf_model(mistral)
    assert outs["r0"] == hf_greedy(ref, llm.tokenizer.encode("The quick brown fox jumps over the lazy dog"), 48)


@pytest.mark.parametrize("caching", [False, True])
def test_greedy_identical_with_and_without_freeing(mistral, caching):
    prompts = ["The quick brown fox jumps over the lazy dog", "a", "The quick brown fox jumps over the lazy cat",
               "0123456789 " * 3]
    freed, _ = _run_steps(_llm(mistral, enable_prefix_caching=caching), prompts)
    kept, _ = _run_steps(_llm(mistral, enable_prefix_caching=caching), prompts, free_window=False)
    assert freed == kept


def test_prefix_cache_serves_released_blocks_it_still_holds(mistral):
    """A released block that is still cached serves a later request with that prefix; once evicted, the
    match stops before it (never a hole), and output stays the same."""
    prompt = "The quick brown fox jumps over the lazy dog, then sleeps"
    llm = _llm(mistral)
    first, _ = _run_steps(llm, [prompt])
    eng = llm.engine
    assert eng.kv.num_cached_blocks > 0
    eng.add_request("again", prompt, GREEDY)
    outs = _finish(eng)
    assert outs[0].outputs[0].token_ids == first["r0"]
    assert outs[0].num_cached_tokens == (len(llm.tokenizer.encode(prompt)) - 1) // BS * BS
    # a cache so small that the first request's released prompt blocks are evicted while it decodes
    small = _llm(mistral, kv_cache_memory=12 * BS * 2 * 3 * 2 * 16 * 4)
    first_small, _ = _run_steps(small, [prompt])
    assert first_small == first
    small.engine.add_request("again", prompt, GREEDY)
    outs = _finish(small.engine)
    assert outs[0].outputs[0].token_ids == first["r0"]
    assert outs[0].num_cached_tokens < len(llm.tokenizer.encode(prompt)) - BS
    small.engine.kv.check_integrity()


def test_release_before_and_holes():
    kv = KVCacheManager(10, 4, enable_caching=True, window=6)
    assert kv.allocate("a", 13)  # 4 blocks
    table = list(kv.tables["a"])
    kv.cache_blocks("a", list(range(13)), 12)
    assert kv.release_before("a", 9) == 2 and kv.tables["a"] == [0, 0] + table[2:]
    assert kv.held_blocks("a") == 2 and kv.num_cached_blocks == 2  # released, still cached
    assert kv.release_before("a", 9) == 0
    kv.check_integrity()
    assert kv.allocate("a", 17) and kv.held_blocks("a") == 3
    kv.free("a")
    kv.check_integrity()
    assert kv.num_used_blocks == 0


def test_start_up_reports_the_window_bound(mistral):
    info = _llm(mistral, kv_cache_memory="1MiB", max_model_len=512).engine.info
    assert info.kv_window == W and info.tokens_per_request == (-(-W // BS) + 1) * BS
    assert info.max_concurrency == info.kv_capacity_tokens / info.tokens_per_request
    assert f"sliding window {W}" in info.summary()
