"""The second KV tier end to end on the tiny model: blocks restored bitwise, greedy output identical
with the tier on and off (prefix offload with a pool too small for the conversations, forced swap
preemption), start-up size errors, and the fall-backs to recompute (unwritable store, failed copy)."""
from __future__ import annotations

import logging
import random

import pytest
import torch

from conftest import make_tiny_model
from ridgeline import LLM, SamplingParams
from ridgeline.bench.workloads import multi_turn_workload
from ridgeline.step_plan import TierCopies
from ridgeline.errors import InvalidRequestError
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.layers.kv_cache import allocate_kv
from ridgeline.runner.kv_store import create_store

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_1k(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-1k-tier"), "llama", max_position_embeddings=1024)


@pytest.mark.parametrize("kind", ["cpu", "disk"])
@pytest.mark.parametrize("k,v", [("int4", "int8"), ("bf16", "f32")])
def test_offloaded_then_restored_blocks_are_bitwise_identical(kind, k, v, tmp_path):
    spec = KVCacheSpec(KV_FORMATS[k], 3, 2, 64, 16, KV_FORMATS[v])
    layers = allocate_kv(spec, 9, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    for kv in layers:  # random bytes everywhere, scales included
        for t in (kv.k, kv.k_scale, kv.v, kv.v_scale):
            if t is not None:
                t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=gen,
                                                        dtype=torch.uint8))
    store = create_store(kind, 4 * spec.bytes_per_block, spec.bytes_per_block, layers, torch.device("cpu"),
                         str(tmp_path), 1 << 40)
    assert store.num_slots == 4
    before = [[t.clone() for t in (kv.k, kv.k_scale, kv.v, kv.v_scale) if t is not None] for kv in layers]
    store.run(TierCopies(stores=[(3, 0), (5, 2), (1, 3)]))
    store.run(TierCopies(loads=[(0, 7), (2, 8), (3, 6)]))
    for kv, old in zip(layers, before):
        for t, o in zip([t for t in (kv.k, kv.k_scale, kv.v, kv.v_scale) if t is not None], old):
            for src, dst in ((3, 7), (5, 8), (1, 6)):
                assert torch.equal(t[dst].view(torch.uint8), o[src].view(torch.uint8))


def _rounds(model, prompts, per_round, **kw):
    """Conversations turn by turn: each round one turn of every conversation (a pool for fewer)."""
    llm = LLM(str(model), dtype="float32", kv_cache_memory="192KiB", max_num_batched_tokens=256, progress=False,
              **kw)
    out = []
    for r in range(0, len(prompts), per_round):
        res = llm.generate(prompts[r:r + per_round], SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
        out += [o.outputs[0].token_ids for o in res]
    llm.engine.kv.check_integrity()
    return out, llm.engine, res


@pytest.mark.parametrize("kind", ["disk", "cpu"])
def test_multi_turn_greedy_identical_with_the_tier(tiny_1k, kind):
    from ridgeline.weights.tokenizer import Tokenizer
    prompts = multi_turn_workload(Tokenizer(tiny_1k), 18, turns=3, concurrent=6, reply_words=(3, 6))
    off, eng_off, _ = _rounds(tiny_1k, prompts, 6)
    on, eng, last = _rounds(tiny_1k, prompts, 6, kv_offload=kind, kv_offload_size="1MiB")
    assert on == off
    stats = eng.kv.tier.stats
    assert stats.stores > 0 and stats.loads > 0 and stats.hits > 0
    assert eng.kv.stats.hits > eng_off.kv.stats.hits  # what the pool lost, the tier gave back
    assert any(o.num_tier_cached_tokens for o in last)
    assert f"kv offload {kind} tier" in eng.info.summary()


def test_forced_swap_preemption_is_lossless(tiny_1k):
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 250) for _ in range(rng.randint(40, 90))] for _ in range(6)]
    params = SamplingParams(max_tokens=60, **GREEDY)

    def run(**kw):
        llm = LLM(str(tiny_1k), dtype="float32", kv_cache_memory="192KiB", max_num_batched_tokens=128,
                  progress=False, **kw)
        out = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.engine.kv.check_integrity()
        return out, llm.engine

    recompute, eng_r = run(preemption_mode="recompute")
    swap, eng_s = run(kv_offload="cpu", kv_offload_size="1MiB", preemption_mode="swap")
    assert swap == recompute
    assert eng_r.scheduler.num_preemptions > 0 and eng_s.scheduler.num_preemptions > 0
    st = eng_s.kv.tier.stats
    assert st.swaps_out == st.swaps_in == eng_s.scheduler.num_preemptions and st.swap_fallbacks == 0
    assert eng_r.scheduler.num_recomputed_tokens > 0 and eng_s.scheduler.num_recomputed_tokens == 0
    assert not eng_s.kv.tier.swapped and len(eng_s.kv.tier.free_slots) + len(eng_s.kv.tier.lru) == \
        eng_s.kv.tier.num_slots


def test_a_full_tier_falls_back_to_recompute_with_one_warning(tiny_1k, caplog):
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 250) for _ in range(rng.randint(40, 90))] for _ in range(6)]
    params = SamplingParams(max_tokens=60, **GREEDY)
    ref = LLM(str(tiny_1k), dtype="float32", kv_cache_memory="192KiB", max_num_batched_tokens=128, progress=False)
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    llm = LLM(str(tiny_1k), dtype="float32", kv_cache_memory="192KiB", max_num_batched_tokens=128, progress=False,
              kv_offload="cpu", kv_offload_size="40KiB", preemption_mode="swap")  # 5 blocks
    with caplog.at_level(logging.WARNING):
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert llm.engine.kv.tier.stats.swap_fallbacks > 0
    assert sum("KV tier is full" in r.getMessage() for r in caplog.records) == 1


def test_offload_larger_than_free_memory_or_disk_is_a_startup_error(tiny_llama, tmp_path):
    for kind in ("cpu", "disk"):
        with pytest.raises(InvalidRequestError, match=f"exceeds the free {'memory' if kind == 'cpu' else 'disk'}"):
            LLM(str(tiny_llama), dtype="float32", kv_cache_memory="1MiB", progress=False, kv_offload=kind,
                kv_offload_size="1000000GiB", kv_offload_path=str(tmp_path))
    with pytest.raises(InvalidRequestError, match="needs kv_offload_size"):
        LLM(str(tiny_llama), progress=False, kv_offload="disk")


def test_unwritable_disk_store_runs_without_the_tier(tiny_llama, caplog, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with caplog.at_level(logging.WARNING):
        llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="1MiB", progress=False, kv_offload="disk",
                  kv_offload_size="1MiB", kv_offload_path=str(not_a_dir))
    assert llm.engine.kv.tier is None and "tier disabled" in llm.engine.info.summary()
    assert any("KV offload disabled" in r.getMessage() for r in caplog.records)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, **GREEDY), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_a_failed_copy_drops_the_tier_and_output_stays_identical(tiny_1k, caplog):
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 250) for _ in range(rng.randint(40, 90))] for _ in range(6)]
    params = SamplingParams(max_tokens=60, **GREEDY)
    ref = LLM(str(tiny_1k), dtype="float32", kv_cache_memory="192KiB", max_num_batched_tokens=128, progress=False)
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    llm = LLM(str(tiny_1k), dtype="float32", kv_cache_memory="192KiB", max_num_batched_tokens=128, progress=False,
              kv_offload="cpu", kv_offload_size="1MiB", preemption_mode="swap")
    store = llm.engine.runner.store
    real, calls = store._copy, []

    def flaky(pairs, store):
        calls.append(store)
        if not store and calls.count(False) == 1:  # the first load: swapped blocks coming back
            raise OSError("injected I/O error")
        real(pairs, store=store)

    store._copy = flaky
    with caplog.at_level(logging.WARNING):
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert calls.count(False) >= 1, "the workload never loaded"
    assert got == want
    assert llm.engine.kv.tier is None and llm.engine.runner.store is None
    assert sum("injected I/O error" in r.getMessage() for r in caplog.records) == 1
    llm.engine.kv.check_integrity()


def test_server_reports_the_tier_in_usage_and_metrics(tiny_llama, tmp_path):
    import httpx

    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings

    engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", kv_cache_memory="192KiB",
                                                kv_offload="disk", kv_offload_size="1MiB",
                                                kv_offload_path=str(tmp_path), progress=False))
    rng = random.Random(3)
    a, b = ([rng.randrange(3, 250) for _ in range(n)] for n in (250, 300))
    with ServerThread(build_app(engine, ServerSettings("tiny"))) as srv:
        def usage(prompt):
            r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200
            return r.json()["usage"]["prompt_tokens_details"]
        usage(a)
        usage(b)  # the pool holds 384 tokens: a's blocks go to the disk tier
        again = usage(a)
        assert again["cached_tokens"] == 240 and again["offload_cached_tokens"] > 0
        text = httpx.get(srv.url + "/metrics").text
    values = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("ridgeline_kv_")}
    assert values['ridgeline_kv_cache_hits_by_tier_total{tier="disk"}'] == again["offload_cached_tokens"]
    assert values['ridgeline_kv_tier_loads_total{tier="disk"}'] > 0
    assert values['ridgeline_kv_tier_stored_bytes_total{tier="disk"}'] == \
        values['ridgeline_kv_tier_stores_total{tier="disk"}'] * engine.kv_spec.bytes_per_block


@pytest.mark.parametrize("method", ["layer-skip", "draft"])
def test_a_request_whose_reuse_outgrows_the_pool_starts_over(tmp_path, method):
    """Sliding window, swap preemption, 8 drafted tokens, a pool of 5 blocks: a request comes back
    to a prefix (its swapped blocks or a prefix-cache hit, a table without the window's holes) that
    with its next tokens needs more than the whole pool. Alone, it starts from its first token instead
    of waiting forever with every request behind it; greedy output is the plain engine's."""
    folder = make_tiny_model(tmp_path / "mistral", "mistral")  # a sliding window of 24
    prompts = ["Once upon a time", "The meaning of life is " * 3, "x", "abcdefghijklmnopqrstuvwxyz",
               "Hello hello hello hello", "1 2 3 4 5 6 7 8", "The quick brown fox", "zz " * 20]
    params = SamplingParams(max_tokens=150, **GREEDY)
    kw = dict(dtype="float32", progress=False, kv_cache_memory="40KiB", max_num_batched_tokens=32,
              preemption_mode="swap", kv_offload="cpu", kv_offload_size="1MiB")

    def run(llm):
        eng, done = llm.engine, {}
        for i, p in enumerate(prompts):
            eng.add_request(f"r{i}", p, params)
        for _ in range(5000):  # the plain engine takes ~1,100 steps
            for out in eng.step(emit_unfinished=False):  # finished requests, whole
                done[out.request_id] = out.outputs[0].token_ids
            if not eng.has_unfinished():
                break
        assert not eng.has_unfinished(), [(r.request_id, r.num_tokens) for r in eng.scheduler.waiting]
        eng.kv.check_integrity()
        return [done[f"r{i}"] for i in range(len(prompts))], eng.scheduler.num_preemptions

    plain, _ = run(LLM(str(folder), **kw))
    spec = dict(speculative_method="layer-skip", speculative_layers=1) if method == "layer-skip" else \
        dict(speculative_method="draft", draft_model=str(folder))
    out, preempted = run(LLM(str(folder), num_speculative_tokens=8, speculative_controller="off", **spec, **kw))
    assert out == plain and preempted > 0
