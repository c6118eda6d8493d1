"""KV transfer between two engines in one process: a prefill engine exports a request's prompt KV
through a connector (tcp, shm), a decode engine adopts it and decodes; output token-identical to a
co-located engine (greedy and seeded, bf16 and int8 KV); injected faults fall back to recompute
with the same output; no KV block, payload or shared-memory segment is left behind."""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from ridgeline.disagg.adopt import attach
from ridgeline.config import EngineConfig
from ridgeline.disagg.connector import TransferError
from ridgeline.disagg.transports import create_connector
from ridgeline.disagg.export import Exports
from ridgeline.disagg.payload import Header, KVPayload, Layout, check_meta
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.messages import EngineRequest
from ridgeline.errors import InvalidRequestError
from ridgeline.sampling_params import SamplingParams

PROMPTS = ["hello there, how are you", "x" * 70, "the quick brown fox jumps over", "a"]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SAFETY_S = 60.0  # never reached unless something is broken
SECRET = b"connector-test-secret-0123456789"


def _engine(model, kv: str) -> LLMEngine:
    """An engine that takes transferred prompt KV too (its scheduler's external KV source attached)."""
    eng = LLMEngine(EngineConfig.from_kwargs(str(model), dtype="float32", kv_cache_memory="2MiB",
                                             kv_cache_dtype=kv, progress=False))
    attach(eng)
    return eng


@pytest.fixture(scope="module", params=["bfloat16", "int8"])
def trio(request, tiny_llama):
    """(prefill engine, decode engine, co-located engine) with one KV format."""
    return tuple(_engine(tiny_llama, request.param) for _ in range(3))


@pytest.fixture(params=["tcp", "shm"])
def link(request, trio):
    """(exports of the prefill engine, the decode side's connector) over one transport."""
    sender = create_connector(request.param, timeout=SAFETY_S, secret=SECRET)
    receiver = create_connector(request.param, timeout=SAFETY_S, secret=SECRET)
    receiver.listen(Layout.of(trio[1].kv_spec, trio[1].max_model_len))
    exports = Exports(trio[0], sender)
    yield exports, receiver
    exports.close()
    sender.close()
    receiver.close()
    trio[0].kv_export = None


def _run(engine: LLMEngine) -> list:
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.finished]
    return outs


def _colocated(engine: LLMEngine, rid: str, prompt, params) -> list[int]:
    engine.add_request(rid, prompt, params)
    return _run(engine)[0].outputs[0].token_ids


def _prefill(trio, link, rid: str, prompt, params, tid: str | None = None):
    """Run the prompt on the prefill engine (max_tokens 1) under a transfer id the decode side issued;
    returns (the export's future, the id)."""
    prefill, _, _ = trio
    exports, receiver = link
    tid = tid or receiver.inbox.expect()
    fut = exports.expect(rid, tid, receiver.address)
    prefill.add_request(rid, prompt, replace(params, max_tokens=1))
    _run(prefill)
    return fut, tid


def _decode(trio, rid: str, prompt, params, payload) -> list[int]:
    decode = trio[1]
    decode.add(EngineRequest(rid, prompt, params, kv=payload))
    return _run(decode)[0].outputs[0].token_ids


def _no_leaks(trio, link) -> None:
    for eng in trio:
        eng.kv.check_integrity()
        assert eng.kv.num_used_blocks == 0 and not attach(eng).pending
    assert len(link[1].inbox) == 0
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("rlkv-")] if os.path.isdir("/dev/shm") else True


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=10,
                                                           ignore_eos=True)], ids=["greedy", "seeded"])
def test_transferred_kv_gives_the_colocated_tokens(trio, link, params):
    before = attach(trio[1]).stats.adopted
    for i, prompt in enumerate(PROMPTS):
        rid = f"r{i}-{params.greedy}"
        fut, tid = _prefill(trio, link, rid, prompt, params)
        delivered = fut.result(SAFETY_S)
        assert delivered.nbytes == trio[1].kv_spec.bytes_per_block * -(-len(trio[1].encode_prompt(prompt)) // 16)
        payload = link[1].inbox.take(tid, SAFETY_S)
        assert payload.authenticated
        assert _decode(trio, rid, prompt, params, payload) == _colocated(trio[2], rid, prompt, params)
    assert attach(trio[1]).stats.adopted - before == len(PROMPTS)
    _no_leaks(trio, link)


def test_first_token_that_ends_the_request(trio, link):
    """max_tokens 1 at the decode side: the transferred first token is the whole answer."""
    params = replace(GREEDY, max_tokens=1)
    fut, tid = _prefill(trio, link, "one", PROMPTS[0], params)
    fut.result(SAFETY_S)
    payload = link[1].inbox.take(tid, SAFETY_S)
    assert _decode(trio, "one", PROMPTS[0], params, payload) == _colocated(trio[2], "one", PROMPTS[0], params)
    _no_leaks(trio, link)


@pytest.mark.parametrize("fault", ["drop", "stall"])
def test_failed_transfer_recomputes_with_the_same_output(trio, link, fault):
    exports, receiver = link
    exports.connector.fault = fault
    fut, tid = _prefill(trio, link, "f", PROMPTS[1], GREEDY)
    if fault == "stall":
        assert not fut.done()  # held until its timeout or unstall: the decode side has given up by then
    # the decode side waits for the KV, which never comes (the wait's timeout is the only way out)
    payload = receiver.inbox.take(tid, 0.01)
    assert payload is None
    exports.connector.unstall()
    with pytest.raises(TransferError):
        fut.result(SAFETY_S)
    before = attach(trio[1]).stats.adopted
    assert _decode(trio, "f", PROMPTS[1], GREEDY, None) == _colocated(trio[2], "f", PROMPTS[1], GREEDY)
    assert attach(trio[1]).stats.adopted == before
    _no_leaks(trio, link)


def test_payload_arriving_after_its_request_gave_up_is_released(trio, link):
    exports, receiver = link
    tid = receiver.inbox.expect()
    assert receiver.inbox.take(tid, 0.0) is None  # the request went on without it
    with pytest.raises(TransferError, match="refused.*no longer awaited"):
        _prefill(trio, link, "late", PROMPTS[0], GREEDY, tid)[0].result(SAFETY_S)
    _no_leaks(trio, link)


def test_unusable_payload_is_recomputed(trio, link):
    """A payload for other prompt tokens (or another KV layout) is never written into the pool."""
    fut, tid = _prefill(trio, link, "u", PROMPTS[0], GREEDY)
    fut.result(SAFETY_S)
    payload = link[1].inbox.take(tid, SAFETY_S)
    before = attach(trio[1]).stats.recomputed
    assert _decode(trio, "u", PROMPTS[2], GREEDY, payload) == _colocated(trio[2], "u", PROMPTS[2], GREEDY)
    assert attach(trio[1]).stats.recomputed == before + 1
    h = payload.header
    other = KVPayload(replace(h, spec_key=h.spec_key + "x"), np.zeros(h.nbytes, np.uint8))
    assert _decode(trio, "v", PROMPTS[0], GREEDY, other) == _colocated(trio[2], "v", PROMPTS[0], GREEDY)
    assert attach(trio[1]).stats.recomputed == before + 2
    _no_leaks(trio, link)


def test_abort_before_adoption_releases_the_payload(trio, link):
    fut, tid = _prefill(trio, link, "a", PROMPTS[1], GREEDY)
    fut.result(SAFETY_S)
    payload = link[1].inbox.take(tid, SAFETY_S)
    decode = trio[1]
    decode.add(EngineRequest("a", PROMPTS[1], GREEDY, kv=payload))
    assert "a" in attach(decode).pending
    decode.abort_request("a")
    assert not attach(decode).pending and payload.data.size == 0
    _run(decode)
    _no_leaks(trio, link)


def test_abort_after_adoption_frees_the_blocks(trio, link):
    fut, tid = _prefill(trio, link, "b", PROMPTS[1], GREEDY)
    fut.result(SAFETY_S)
    decode = trio[1]
    decode.add(EngineRequest("b", PROMPTS[1], GREEDY, kv=link[1].inbox.take(tid, SAFETY_S)))
    decode.step()
    assert decode.kv.num_used_blocks > 0
    decode.abort_request("b")
    _run(decode)
    _no_leaks(trio, link)


def test_header_round_trip_and_registry():
    layout = Layout("k", 16, 64, 100)
    for rng in ([0, 255], None):
        h = Header("0123456789abcdef" * 2, "k", [1, 2, 3], 5, 1, 64, rng)
        assert Header.from_wire(check_meta(h.meta(), layout), h.tail()) == h
    with pytest.raises(InvalidRequestError, match="tcp, shm"):
        create_connector("carrier-pigeon")


def test_adoption_copies_a_bounded_number_of_tokens_per_step(trio, link, tiny_llama):
    """A burst of arrivals is adopted over several steps (max_num_batched_tokens prompt tokens a step, one
    payload at least), in order, with the co-located tokens."""
    kv = {"bf16": "bfloat16"}.get(trio[1].kv_spec.format.name, trio[1].kv_spec.format.name)
    decode = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB",
                                                kv_cache_dtype=kv, max_num_batched_tokens=32, progress=False))
    attach(decode)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2]]  # 24, 70 and 30 tokens: one payload a step under 32
    for i, prompt in enumerate(prompts):
        fut, tid = _prefill(trio, link, f"burst{i}", prompt, GREEDY)
        fut.result(SAFETY_S)
        decode.add(EngineRequest(f"burst{i}", prompt, GREEDY, kv=link[1].inbox.take(tid, SAFETY_S)))
    adopted = []
    for _ in prompts:
        decode.step()
        adopted.append(attach(decode).stats.adopted)
    assert adopted == [1, 2, 3]
    got = {o.request_id: o.outputs[0].token_ids for o in _run(decode)}
    for i, prompt in enumerate(prompts):
        assert got[f"burst{i}"] == _colocated(trio[2], f"burst{i}", prompt, GREEDY)
    decode.kv.check_integrity()
    assert decode.kv.num_used_blocks == 0


def test_adopted_kv_lands_after_the_tier_stored_what_it_evicts(tiny_llama):
    """A decode engine with a CPU tier: adopting transferred requests evicts a cached prompt's blocks
    to the tier, which stores them before the payloads are written over them, so that prompt again
    (served from the tier) gives the co-located output."""
    def engine(**kw):
        return LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", progress=False, **kw))
    prefill, colocated = engine(kv_cache_memory="2MiB"), engine(kv_cache_memory="2MiB")
    decode = engine(kv_cache_memory="64KiB", kv_offload="cpu", kv_offload_size="1MiB")
    attach(decode)
    sender = create_connector("tcp", timeout=SAFETY_S, secret=SECRET)
    receiver = create_connector("tcp", timeout=SAFETY_S, secret=SECRET)
    receiver.listen(Layout.of(decode.kv_spec, decode.max_model_len))
    exports = Exports(prefill, sender)
    try:
        first = "The meaning of life is " * 4
        want = _colocated(colocated, "a", first, GREEDY)
        assert _colocated(decode, "a", first, GREEDY) == want  # its full blocks stay cached
        for i, prompt in enumerate(["zz " * 30, "q" * 90, "the quick brown fox " * 5]):
            tid = receiver.inbox.expect()
            fut = exports.expect(f"t{i}", tid, receiver.address)
            prefill.add_request(f"t{i}", prompt, replace(GREEDY, max_tokens=1))
            _run(prefill)
            fut.result(SAFETY_S)
            payload = receiver.inbox.take(tid, SAFETY_S)
            got = _decode((prefill, decode, colocated), f"t{i}", prompt, GREEDY, payload)
            assert got == _colocated(colocated, f"c{i}", prompt, GREEDY)
        assert attach(decode).stats.adopted == 3 and decode.kv.tier.stats.stores > 0
        decode.add_request("again", first, GREEDY)
        out = _run(decode)[0]
        assert out.num_tier_cached_tokens > 0 and out.outputs[0].token_ids == want
        decode.kv.check_integrity()
    finally:
        exports.close()
        sender.close()
        receiver.close()
