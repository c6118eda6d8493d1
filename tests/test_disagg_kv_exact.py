"""What a decode engine takes from a transfer is exactly one request's prompt KV, used for that request
alone: an export carries no byte of the last block past its prompt (whatever an earlier request left
in the reused block; every KV format, scales included); a payload that does not fit its request, or
whose bytes cannot be written, is recomputed without touching a concurrent request; KV that did not
come over an authenticated connector never enters the prefix cache."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from ridgeline.disagg.adopt import attach
from ridgeline.config import EngineConfig
from ridgeline.disagg import adopt
from ridgeline.disagg.blocks import gather, scatter, tail_ranges
from ridgeline.disagg.export import Exports
from ridgeline.disagg.payload import KVPayload, Layout
from ridgeline.disagg.transports import create_connector
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.messages import EngineRequest
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.layers.kv_cache import allocate_kv
from ridgeline.runner.kv_store import block_regions
from ridgeline.sampling_params import SamplingParams

SAFETY_S = 60.0
SECRET = b"kv-exact-test-secret-0123456789ab"
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
STALE = 0x5A  # what an earlier request left in every byte of the pool


@pytest.mark.parametrize("k, v", [(f, f) for f in KV_FORMATS] + [("int8", "bf16"), ("int4", "fp8_e4m3")])
@pytest.mark.parametrize("num_tokens", [21, 32, 1])
def test_gather_and_scatter_carry_only_the_prompts_positions(k, v, num_tokens):
    spec = KVCacheSpec(KV_FORMATS[k], 2, 2, 64, 16, KV_FORMATS[v])
    pool = allocate_kv(spec, 5, torch.device("cpu"))
    for r in block_regions(pool):
        r.copy_(torch.randint(0, 256, r.shape, dtype=torch.uint8))  # a longer prompt's bytes, scales too
    blocks = [3, 1][:-(-num_tokens // 16)]
    data = gather(pool, blocks, num_tokens)
    assert data.size == len(blocks) * spec.bytes_per_block
    tails = tail_ranges(pool, len(blocks), num_tokens)
    assert len(tails) == (0 if num_tokens % 16 == 0 else len(block_regions(pool)))
    keep = np.ones(data.size, bool)
    for start, stop in tails:
        assert not data[start:stop].any()
        keep[start:stop] = False
    assert (data[keep] == _raw(pool, blocks)[keep]).all()  # every prompt position as stored
    # the receiving side writes zeros past the prompt whatever the sender sent there
    dirty = np.full(data.size, STALE, np.uint8)
    other = allocate_kv(spec, 5, torch.device("cpu"))
    scatter(other, [2, 4][:len(blocks)], dirty, num_tokens)
    got = _raw(other, [2, 4][:len(blocks)])
    assert (got[keep] == STALE).all() and not got[~keep].any()


def _raw(pool, blocks: list[int]) -> np.ndarray:
    return np.concatenate([r[b].numpy() for r in block_regions(pool) for b in blocks])


def _engine(model, kv: str = "int8", **kw) -> LLMEngine:
    """An engine that takes transferred prompt KV too (its scheduler's external KV source attached)."""
    eng = LLMEngine(EngineConfig.from_kwargs(str(model), dtype="float32", kv_cache_memory="2MiB", kv_cache_dtype=kv,
                                             progress=False, **kw))
    attach(eng)
    return eng


@pytest.fixture(scope="module")
def engines(tiny_llama):
    """(prefill, decode, co-located) int8-KV engines, a tcp link between the first two."""
    prefill, decode, coloc = _engine(tiny_llama), _engine(tiny_llama), _engine(tiny_llama)
    sender = create_connector("tcp", timeout=SAFETY_S, secret=SECRET)
    receiver = create_connector("tcp", timeout=SAFETY_S, secret=SECRET)
    receiver.listen(Layout.of(decode.kv_spec, decode.max_model_len))
    exports = Exports(prefill, sender)
    yield prefill, decode, coloc, exports, receiver
    exports.close()
    sender.close()
    receiver.close()


def _run(engine: LLMEngine) -> dict:
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    return outs


def _transfer(engines, rid: str, prompt: str) -> KVPayload:
    prefill, _, _, exports, receiver = engines
    tid = receiver.inbox.expect()
    fut = exports.expect(rid, tid, receiver.address)
    prefill.add_request(rid, prompt, replace(GREEDY, max_tokens=1))
    _run(prefill)
    fut.result(SAFETY_S)
    return receiver.inbox.take(tid, SAFETY_S)


def _colocated(engines, rid: str, prompt: str) -> list[int]:
    coloc = engines[2]
    coloc.add_request(rid, prompt, GREEDY)
    return _run(coloc)[rid].outputs[0].token_ids


def test_an_export_leaks_nothing_a_reused_block_held(engines):
    prefill = engines[0]
    prefill.kv.reset_prefix_cache()
    for r in block_regions(prefill.runner.kv):
        r.fill_(STALE)  # as if every block had held a longer prompt's KV
    prompt = "the quick brown fox"  # 19 tokens: its second block is partly used
    payload = _transfer(engines, "stale", prompt)
    n = payload.num_tokens
    assert n % 16 and payload.authenticated
    tails = tail_ranges(prefill.runner.kv, payload.header.num_blocks, n)
    keep = np.ones(payload.data.size, bool)
    for start, stop in tails:
        assert not payload.data[start:stop].any(), "bytes past the prompt left the prefill worker"
        keep[start:stop] = False
    assert (payload.data[keep] != STALE).any()  # the prompt's own KV did travel
    payload.release()
    prefill.kv.reset_prefix_cache()
    for r in block_regions(prefill.runner.kv):
        r.zero_()


def test_only_authenticated_kv_enters_the_prefix_cache(engines):
    _, decode, _, _, _ = engines
    prompt = "a prompt of a few blocks, " * 3  # 78 tokens: 4 full blocks
    for authenticated in (False, True):
        decode.kv.reset_prefix_cache()
        got = _transfer(engines, f"p{authenticated}", prompt)
        payload = KVPayload(got.header, got.data.copy(), authenticated=authenticated)
        got.release()
        decode.add(EngineRequest(f"p{authenticated}", prompt, GREEDY, kv=payload))
        assert _run(decode)[f"p{authenticated}"].outputs[0].token_ids == _colocated(engines, f"c{authenticated}", prompt)
        assert (decode.kv.num_cached_blocks > 0) == authenticated
        decode.add_request(f"again{authenticated}", prompt, GREEDY)  # another client's request, the same prompt
        again = _run(decode)[f"again{authenticated}"]
        assert (again.num_cached_tokens > 0) == authenticated
        assert again.outputs[0].token_ids == _colocated(engines, f"c{authenticated}", prompt)
    decode.kv.check_integrity()


def test_a_bad_payload_leaves_a_concurrent_request_alone(engines, monkeypatch):
    _, decode, _, _, _ = engines
    decode.kv.reset_prefix_cache()
    prompts = {"good": "hello there, how are you", "short": "x" * 40, "unwritable": "the quick brown fox jumps"}
    payloads = {rid: _transfer(engines, rid, p) for rid, p in prompts.items()}
    h = payloads["short"].header  # its header and bytes one block short of the prompt's
    cut = KVPayload(replace(h, num_blocks=h.num_blocks - 1, nbytes=h.nbytes - decode.kv_spec.bytes_per_block),
                    payloads["short"].data[:h.nbytes - decode.kv_spec.bytes_per_block].copy(), authenticated=True)
    payloads["short"].release()
    payloads["short"] = cut
    real = adopt.scatter

    def scatter_fails_for_one(layers, blocks, data, n):
        if n == payloads["unwritable"].num_tokens:
            raise RuntimeError("injected: the bytes do not fit")
        real(layers, blocks, data, n)
    monkeypatch.setattr(adopt, "scatter", scatter_fails_for_one)
    before = attach(decode).stats
    adopted, recomputed = before.adopted, before.recomputed
    for rid, prompt in prompts.items():
        decode.add(EngineRequest(rid, prompt, GREEDY, kv=payloads[rid]))
    outs = _run(decode)
    for rid, prompt in prompts.items():
        assert outs[rid].outputs[0].token_ids == _colocated(engines, f"c-{rid}", prompt), rid
    assert attach(decode).stats.adopted == adopted + 1 and attach(decode).stats.recomputed == recomputed + 2
    assert all(p.data.size == 0 for p in payloads.values())  # every payload released
    decode.kv.check_integrity()
    assert decode.kv.num_used_blocks == 0
