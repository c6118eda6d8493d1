"""The `grammar` proposer: a constrained request's drafts are the tokens its grammar forces next. The
target verifies them, so greedy output is token for token the output without speculation, on every
corpus schema, batched or one at a time, through chunked prefill, alone or chained first; requests
without structured outputs get none from it; seeded sampled requests stay reproducible."""
from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator
from test_structured import CORPUS, MAX_TOKENS, PROMPT, SUBSET, engine, greedy, run

from ridgeline.config import SpeculativeConfig
from ridgeline.engine.proposal import ProposalRequest, create_proposer, known_methods
from ridgeline.sampling_params import SamplingParams
from ridgeline.structured_params import StructuredOutputs

SPEC = dict(num_speculative_tokens=4, speculative_controller="off")


@pytest.fixture(scope="module")
def plain(tiny_llama):
    eng = engine(tiny_llama)
    return {"all": run(eng, {n: (PROMPT + n, greedy(s)) for n, s in CORPUS.items()}),
            "alone": {n: run(eng, {n: (PROMPT + n, greedy(CORPUS[n]))})[n] for n in SUBSET}}


@pytest.mark.parametrize("method", ["grammar", "grammar+ngram"])
def test_grammar_drafts_keep_greedy_output(tiny_llama, plain, method):
    spec = engine(tiny_llama, speculative_method=method, **SPEC)
    assert run(spec, {n: (PROMPT + n, greedy(s)) for n, s in CORPUS.items()}) == plain["all"]
    for n in SUBSET:  # batch 1
        assert run(spec, {n: (PROMPT + n, greedy(CORPUS[n]))})[n] == plain["alone"][n]
    stats = spec.spec_stats
    assert stats.proposed > 0 and stats.accepted > 0.5 * stats.proposed  # forced text is mostly the model's too


def test_grammar_drafts_through_chunked_prefill_and_the_controller(tiny_llama, plain):
    long = "a fairly long prompt that spans several blocks of the cache " * 3
    eng = engine(tiny_llama)
    for controller in ("on", "off"):
        spec = engine(tiny_llama, speculative_method="grammar", num_speculative_tokens=4,
                      speculative_controller=controller, max_num_batched_tokens=16)
        reqs = {n: (long + n, greedy(CORPUS[n])) for n in SUBSET}
        assert run(spec, reqs) == run(eng, reqs)


def test_only_constrained_requests_get_grammar_drafts(tiny_llama):
    spec = engine(tiny_llama, speculative_method="grammar", **SPEC)
    run(spec, {"plain": (PROMPT, SamplingParams(temperature=0, max_tokens=30))})
    assert spec.spec_stats.proposed == 0
    run(spec, {"json": (PROMPT, greedy(CORPUS["fn_book_flight"]))})
    assert spec.spec_stats.proposed > 0


def test_forced_tokens_are_allowed_and_bounded(tiny_llama):
    assert "grammar" in known_methods()
    eng = engine(tiny_llama)
    c = eng.structured.backend.create(StructuredOutputs(json=CORPUS["fn_book_flight"]))
    proposer = create_proposer(SpeculativeConfig(speculative_method="grammar"), eng.arch.vocab_size)
    forced = c.forced_tokens()
    assert len(forced) > 2 and c.valid_prefix(forced) == len(forced)  # `{"` and the first key are forced
    got = proposer.propose([ProposalRequest("a", [1, 2], 2, constraint=c), ProposalRequest("b", [1, 2], 4)])
    assert got == [forced[:2], []]
    assert c.forced_tokens() == forced  # state unchanged


def test_seeded_sampling_with_grammar_drafts_is_reproducible(tiny_llama):
    def sampled(seed):
        return SamplingParams(temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
                              structured=StructuredOutputs(json=CORPUS["fn_book_flight"]))
    reqs = {f"s{i}": (PROMPT, sampled(i)) for i in range(3)}
    want = run(engine(tiny_llama), reqs)
    # under the controller a seeded sampled request gets no drafts (its draws would follow the rows
    # each step verifies): the output is the plain engine's
    on = engine(tiny_llama, speculative_method="grammar", num_speculative_tokens=4)
    assert run(on, reqs) == want and on.spec_stats.proposed == 0
    # k pinned: it drafts, valid, and the same on every run with the same k
    off = engine(tiny_llama, speculative_method="grammar", **SPEC)
    first = run(off, reqs)
    assert off.spec_stats.proposed > 0 and run(off, reqs) == first
    for [(text, _, finish, _)] in first.values():
        assert finish == "stop"
        Draft202012Validator(CORPUS["fn_book_flight"]).validate(json.loads(text))
