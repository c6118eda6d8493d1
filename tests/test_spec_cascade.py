"""Chained proposers (`ngram+eagle`, spec/cascade.py): each request takes the first member's
proposal that is not empty, later members are asked only for the rest; every member observes every
step and forgets finished requests; greedy output is token for token the plain engine's through
chunked prefill, prefix caching and forced preemption with both members drafting; bad chains are
clear errors."""
from __future__ import annotations

import argparse

import pytest

from ridgeline import LLM
from ridgeline.config import SpeculativeConfig
from ridgeline.errors import InvalidRequestError
from ridgeline.speculative.cascade import CascadeProposer
from ridgeline.engine.proposal import ProposalRequest, Proposer
from ridgeline.runner.draft import Draft
from test_multi_token_steps import OPTS, _params, _run, same_as_plain

BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)


class _Fake(Proposer):
    def __init__(self, name, answers, hidden=False, setup=0.0):
        super().__init__(SpeculativeConfig(), 100)
        self.name, self.answers, self.wants_hidden, self.setup = name, answers, hidden, setup
        self.asked, self.observed, self.forgot = [], 0, []

    def propose(self, requests):
        self.asked.append([r.req_id for r in requests])
        self.setup_time = self.setup
        got = [self.answers.get(r.req_id, []) for r in requests]
        return [g if isinstance(g, Draft) else g[:r.k] for g, r in zip(got, requests)]

    def observe(self, plan, sampled, hidden, requests):
        self.observed += 1

    def forget(self, req_ids):
        self.forgot += list(req_ids)


def test_each_request_takes_the_first_proposal_and_later_members_see_only_the_rest():
    draft = Draft([7, 8])
    first = _Fake("first", {"a": [1, 2], "c": [3]}, setup=0.25)
    second = _Fake("second", {"a": [9], "b": draft, "c": [4], "d": []}, hidden=True, setup=0.5)
    chain = CascadeProposer(SpeculativeConfig(), 100, [first, second])
    assert chain.name == "first+second" and chain.wants_hidden
    reqs = [ProposalRequest(r, [0, 1], 2) for r in "abcd"]
    out = chain.propose(reqs)
    assert out == [[1, 2], draft, [3], []]
    assert first.asked == [["a", "b", "c", "d"]] and second.asked == [["b", "d"]]
    assert chain.setup_time == 0.75
    chain.observe(None, [], None, {})
    assert (first.observed, second.observed) == (0, 1)  # only a member that reads hidden states
    chain.forget(["a", "b"])
    assert first.forgot == second.forgot == ["a", "b"]


def test_a_member_not_asked_costs_nothing():
    first = _Fake("first", {"a": [1]})
    second = _Fake("second", {"a": [2]})
    chain = CascadeProposer(SpeculativeConfig(), 100, [first, second])
    assert chain.propose([ProposalRequest("a", [0], 1)]) == [[1]]
    assert second.asked == [] and chain.setup_time == 0.0


@pytest.mark.parametrize("opts", list(OPTS), ids=list(OPTS))
def test_ngram_then_eagle_greedy_output_is_the_plain_engines(tiny_llama, tiny_head, opts):
    kw = {**BASE, **OPTS[opts]}
    params = _params()
    plain = _run(LLM(str(tiny_llama), **kw), params)
    llm = LLM(str(tiny_llama), speculative_method="ngram+eagle", draft_model=str(tiny_head), ngram_min=1,
              num_speculative_tokens=3, speculative_controller="off", **kw)
    chain = llm.engine.proposer
    assert chain.name == "ngram+eagle" and llm.engine.runner.keep_hidden
    asked = {m.name: 0 for m in chain.members}
    for m in chain.members:  # count the requests each member drafted for
        def counting(reqs, m=m, inner=m.propose):
            got = inner(reqs)
            asked[m.name] += sum(1 for g in got if g)
            return got
        m.propose = counting
    def both_drafted():
        assert asked["ngram"] > 0 and asked["eagle"] > 0, asked
    same_as_plain(llm, params, plain, opts, both_drafted)
    llm.engine.step()  # per-request state of finished requests goes at the next step
    assert not chain.members[1].states and not chain.members[0].indexes


@pytest.mark.parametrize("method, extra, why", [
    ("ngram+ngram", {}, "named once each"),
    ("draft+eagle", {"draft_model": "x"}, "not together"),
    ("ngram+", {}, "named once each"),
    ("ngram+layer-skip", {}, "needs speculative_layers"),
    ("ngram", {"draft_model": "x"}, "draft_model needs"),
])
def test_bad_chains_are_clear_errors(method, extra, why):
    with pytest.raises(InvalidRequestError, match=why):
        SpeculativeConfig(speculative_method=method, **extra)


def test_an_unknown_member_is_named(tiny_llama):
    with pytest.raises(InvalidRequestError, match="unknown speculative method 'bogus'"):
        LLM(str(tiny_llama), speculative_method="ngram+bogus", **BASE)
    from ridgeline.engine.args import speculative_method
    assert speculative_method("ngram+eagle") == "ngram+eagle"
    with pytest.raises(argparse.ArgumentTypeError, match="'bogus'"):
        speculative_method("eagle+bogus")


def test_a_chain_with_layer_skip_builds(tiny_llama):
    llm = LLM(str(tiny_llama), speculative_method="ngram+layer-skip", speculative_layers=1, **BASE)
    assert [m.name for m in llm.engine.proposer.members] == ["ngram", "layer-skip"]
    assert "ngram+layer-skip" in llm.info.summary() and "first of them that proposes" in llm.info.summary()
