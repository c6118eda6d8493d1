"""KV events: replaying a replica's events gives exactly its prefix cache; the ZeroMQ publisher and
the router's follower keep the index equal to it, resyncing from a snapshot on a gap or a restart;
the router's prompt hashes are the replica's."""
from __future__ import annotations

import asyncio
import json

import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.engine.kv_events import KVEventRecorder, apply_events
from ridgeline.engine.prefix_cache import block_hashes
from ridgeline.router.kv_index import KVIndex
from ridgeline.router.kv_subscriber import KVFollower, connect_address

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (pip install 'ridgeline[router]')")


def _prompts(n: int) -> list[str]:  # 4 prefixes of ~100 byte tokens, shared by several prompts each
    return [f"tenant {i % 4} " + "abcdefghij" * (9 + i % 4) + f" question {i}" for i in range(n)]


@pytest.fixture(scope="module")
def recorded(tiny_llama):
    """A small pool (evictions happen) with a recorder; the events of every step, in order."""
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="96KiB", max_num_batched_tokens=128,
              progress=False)
    eng = llm.engine
    recorder = KVEventRecorder()
    eng.kv.cache.events = recorder
    batches = []
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i, prompt in enumerate(_prompts(16)):
        eng.add_request(f"r{i}", prompt, params)
        if i % 3 == 2:
            while eng.has_unfinished():
                eng.step()
                batches.append(recorder.drain())
    while eng.has_unfinished():
        eng.step()
        batches.append(recorder.drain())
    return eng, batches


def test_replayed_events_give_the_prefix_cache(recorded):
    eng, batches = recorded
    held: set[bytes] = set()
    for batch in batches:
        apply_events(held, batch)
    assert eng.kv.stats.evictions > 0, "the pool must have evicted for this test to mean something"
    assert held == set(eng.kv.cache.by_hash)
    index = KVIndex()
    for batch in batches:
        index.apply("r", batch)
    assert index.held["r"] == held and set(index.owners) == held


def test_recorder_groups_runs_in_order():
    rec = KVEventRecorder()
    for kind, h in (("s", b"a"), ("s", b"b"), ("r", b"a"), ("s", b"c")):
        (rec.stored if kind == "s" else rec.removed)(h)
    assert rec.drain() == [("stored", [b"a", b"b"]), ("removed", [b"a"]), ("stored", [b"c"])]
    assert rec.drain() == []


def _publisher(block_size: int = 16):
    from ridgeline.serve.kv_publisher import KVEventPublisher
    return KVEventPublisher("tcp://127.0.0.1:*", block_size)


def _recv(sub) -> dict:
    assert sub.poll(30_000), "no KV event message arrived"
    topic, payload = sub.recv_multipart()
    assert topic == b"kv"
    return json.loads(payload)


def test_publisher_to_follower_with_a_gap_and_a_restart(recorded):
    _, batches = recorded
    pub = _publisher()
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.connect(pub.endpoint)
    sub.subscribe(b"kv")
    try:
        # a subscriber misses what is sent before it has joined: publish until one arrives
        while not sub.poll(50):
            pub.recorder.stored(b"\0" * 32)
            pub.publish()
        sub.recv_multipart()
        index = KVIndex()
        follower = KVFollower("r", index, _snapshot_of(pub))

        async def run():
            for i, batch in enumerate(b for b in batches if b):
                for kind, hashes in batch:
                    for h in hashes:
                        (pub.recorder.stored if kind == "stored" else pub.recorder.removed)(h)
                pub.publish()
                msg = _recv(sub)
                if i != 3:  # message 3 is lost: the next one shows a gap
                    await follower.handle(msg)
        asyncio.run(run())
        assert follower.resyncs == 2  # the start, then the gap
        assert index.held["r"] == pub.held
        restarted = _publisher()  # same replica, new instance: seq starts again at 1
        try:
            follower._resync = _snapshot_of(restarted)
            restarted.recorder.stored(b"\1" * 32)
            restarted.publish()
            asyncio.run(follower.handle({"instance": restarted.instance, "seq": 1, "events": []}))
            assert follower.resyncs == 3 and index.held["r"] == {b"\1" * 32}
        finally:
            restarted.close()
    finally:
        sub.close(0)
        pub.close()


def _snapshot_of(pub):
    async def snapshot():
        return pub.snapshot()
    return snapshot


def test_connect_address_replaces_wildcards():
    assert connect_address("tcp://0.0.0.0:5557", "http://10.1.2.3:8000") == "tcp://10.1.2.3:5557"
    assert connect_address("tcp://*:5557", "http://node-2:8000") == "tcp://node-2:5557"
    assert connect_address("tcp://127.0.0.1:5557", "http://10.1.2.3:8000") == "tcp://127.0.0.1:5557"
    assert connect_address("ipc:///tmp/r0.kv", "http://x:1") == "ipc:///tmp/r0.kv"


def test_router_hashes_are_the_replicas(tiny_llama):
    """The router renders and tokenizes as the server's routes do, so its block hashes are the engine's."""
    from ridgeline.router.prompt_hash import PromptHasher
    from ridgeline.weights.tokenizer import Tokenizer
    tok = Tokenizer(tiny_llama)
    hasher = PromptHasher(tiny_llama, 16)
    messages = [{"role": "system", "content": "x" * 70}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    ids = tok.encode_chat([{"role": "system", "content": "x" * 70}, {"role": "user", "content": "hi"}])
    r = hasher.route("/v1/chat/completions", {"model": "m", "messages": messages, "cache_salt": "s"})
    assert r.num_tokens == len(ids) and r.hashes == block_hashes(ids[:-1], 16, "s") and len(r.hashes) >= 4
    r = hasher.route("/v1/completions", {"model": "m", "prompt": "y" * 40})
    assert r.hashes == block_hashes(tok.encode("y" * 40)[:-1], 16)
    assert hasher.route("/v1/completions", {"model": "m", "prompt": [[1] * 40, [2] * 40]}).hashes == \
        block_hashes([1] * 39, 16)
    assert hasher.route("/v1/chat/completions", {"messages": "not a list"}).hashes == []
    assert hasher.route("/v1/completions", None).num_tokens == 0
