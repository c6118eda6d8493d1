"""Multi-token steps: a request can carry k proposed tokens; the runner verifies them in one
forward and keeps the ones the target agrees with; the scheduler advances by what was accepted and
the KV manager gives back the slots of the rest. Proven with proposers that guess junk, or the
right answer with noise: greedy output stays token-for-token the plain engine's, through chunked
prefill, prefix caching and preemption, and the KV bookkeeping holds after every step."""
from __future__ import annotations

import random

import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.engine.outputs import Accumulator
from ridgeline.engine.proposal import PROPOSERS, Proposer

PROMPTS = ["Once upon a time", "The meaning of life is " * 3, "x", "abcdefghijklmnopqrstuvwxyz",
           "Hello hello hello hello", "1 2 3 4 5 6 7 8", "The quick brown fox", "zz"]
REFERENCE: dict[tuple[int, ...], list[int]] = {}  # prompt ids -> plain greedy output ids


class Junk(Proposer):
    """0..k random tokens."""

    def __init__(self, config, vocab_size):
        super().__init__(config, vocab_size)
        self.rng = random.Random(0)

    def propose(self, requests):
        return [[self.rng.randrange(self.vocab_size) for _ in range(self.rng.randint(0, r.k))] for r in requests]


class Oracle(Junk):
    """The plain engine's continuation, each token wrong with probability 1/4: long accepted runs,
    rejections at every position, proposals that run into EOS and stop strings."""

    def propose(self, requests):
        out = []
        for r in requests:
            ids = list(r.token_ids)
            ref = next((list(p) + o for p, o in sorted(REFERENCE.items(), key=lambda po: -len(po[0]))
                        if ids[:len(p)] == list(p)), None)
            guess = ref[len(ids):len(ids) + r.k] if ref is not None and ref[:len(ids)] == ids else []
            out.append([t if self.rng.random() > 0.25 else self.rng.randrange(self.vocab_size) for t in guess])
        return out


@pytest.fixture(scope="module", autouse=True)
def proposers():
    PROPOSERS.update({"junk-test": Junk, "oracle-test": Oracle})
    yield
    for name in ("junk-test", "oracle-test"):
        PROPOSERS.pop(name, None)


def _run(llm: LLM, params: list[SamplingParams], check=True) -> list[list[int]]:
    """Drive the engine by hand, checking the KV bookkeeping after every step."""
    eng = llm.engine
    for i, (p, sp) in enumerate(zip(PROMPTS, params)):
        eng.add_request(f"r{i}", p, sp)
    done, acc = {}, Accumulator()
    while eng.has_unfinished():
        for delta in eng.step():
            out = acc.add(delta)
            if out.finished:
                done[out.request_id] = [c.token_ids for c in out.outputs]
        if check:
            eng.kv.check_integrity()
    assert eng.kv.num_free_blocks == eng.kv.num_usable_blocks
    return [done[f"r{i}"] for i in range(len(PROMPTS))]


def same_as_plain(llm: LLM, params: list[SamplingParams], plain: list, opts: str, after_first=None):
    """llm's output equals the plain engine's (the KV books checked after every step) with proposals
    verified; under forced preemption it preempted; with prefix caching, the same prompts again (now
    from the cache, which holds only verified tokens) give the same output. after_first() runs its
    own checks between the two runs. Returns the speculation counters of the first run."""
    assert _run(llm, params) == plain
    if after_first is not None:
        after_first()
    stats = llm.engine.spec_stats.copy()
    assert stats.proposed > 0
    if opts == "preempt":
        assert llm.engine.scheduler.num_preemptions > 0
    if llm.engine.kv.caching:
        assert _run(llm, params) == plain
    return stats


def _params(seed=0):
    rng = random.Random(seed)
    return [SamplingParams(temperature=0, max_tokens=rng.randint(1, 40), ignore_eos=rng.random() < 0.5,
                           stop=["ll"] if rng.random() < 0.3 else None) for _ in PROMPTS]


OPTS = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=7),
    "preempt": dict(kv_cache_memory="48KiB", max_num_batched_tokens=32),
    "no-prefix-cache": dict(enable_prefix_caching=False),
}


@pytest.mark.parametrize("method", ["junk-test", "oracle-test"])
@pytest.mark.parametrize("opts", list(OPTS), ids=list(OPTS))
def test_greedy_output_is_the_plain_engines(tiny_llama, method, opts):
    kw = {**dict(dtype="float32", kv_cache_memory="2MiB", progress=False), **OPTS[opts]}
    params = _params()
    plain = _run(LLM(str(tiny_llama), **kw), params)
    tok = LLM(str(tiny_llama), **kw).tokenizer
    REFERENCE.clear()
    REFERENCE.update({tuple(tok.encode(p)): o[0] for p, o in zip(PROMPTS, plain)})
    llm = LLM(str(tiny_llama), speculative_method=method, num_speculative_tokens=4,
              speculative_controller="off", **kw)
    stats = same_as_plain(llm, params, plain, opts)
    if method == "oracle-test":
        assert stats.accepted > stats.proposed // 3 and max(stats.accepted_at) > 0 and stats.accepted_at[-1] > 0


def test_logprobs_and_penalties_per_kept_token(tiny_llama):
    kw = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2, repetition_penalty=1.3,
                             frequency_penalty=0.5)] * len(PROMPTS)

    def run(llm):  # (tokens and top ids per output, logprobs per output)
        outs = [c for o in llm.generate(PROMPTS, params, use_tqdm=False) for c in o.outputs]
        return ([(c.token_ids, [(lp.token_id, [t for t, _ in lp.top]) for lp in c.logprobs]) for c in outs],
                [[lp.logprob for lp in c.logprobs] for c in outs])

    plain, plain_lp = run(LLM(str(tiny_llama), **kw))
    REFERENCE.clear()
    tok = LLM(str(tiny_llama), **kw).tokenizer
    REFERENCE.update({tuple(tok.encode(p)): o[0] for p, o in zip(PROMPTS, plain)})
    llm = LLM(str(tiny_llama), speculative_method="oracle-test", speculative_controller="off", **kw)
    spec, spec_lp = run(llm)
    assert spec == plain
    if llm.engine.runner.device.type == "cpu":  # the CPU kernels compute a row alike in any step
        assert spec_lp == plain_lp
    else:  # a GPU's matmul may round a k-row step differently
        assert [v for x in spec_lp for v in x] == pytest.approx([v for x in plain_lp for v in x], abs=1e-4)


def test_kv_manager_shrinks_a_table_and_keeps_the_books():
    from ridgeline.engine.kv_manager import KVCacheManager
    kv = KVCacheManager(10, 4, enable_caching=True)
    assert kv.allocate("a", 14)  # 4 blocks
    table = list(kv.tables["a"])
    kv.cache_blocks("a", list(range(14)), 8)  # two full computed blocks cached
    assert kv.shrink("a", 9) == 1 and kv.tables["a"] == table[:3]
    assert kv.shrink("a", 9) == 0
    kv.check_integrity()
    assert kv.num_free_blocks == 9 - 3
    kv.free("a")
    kv.check_integrity()
    assert kv.num_cached_blocks == 2 and kv.num_free_blocks == 9


def test_unknown_method_is_a_clear_error(tiny_llama):
    from ridgeline.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="unknown speculative method 'nope'"):
        LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", progress=False, speculative_method="nope")
