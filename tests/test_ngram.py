"""The ngram (prompt lookup) proposer: what it proposes, and that decoding with it is the plain
engine's output, token for token, with more than one token kept per step where text repeats."""
from __future__ import annotations

import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.config import SpeculativeConfig
from ridgeline.errors import InvalidRequestError
from ridgeline.speculative.ngram import NgramProposer
from ridgeline.engine.proposal import ProposalRequest


def test_proposes_what_followed_the_last_earlier_occurrence():
    p = NgramProposer(SpeculativeConfig("ngram", 3, ngram_min=1, ngram_max=3), 100)
    ids = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert p.propose([ProposalRequest("a", ids, 3)]) == [[4, 5, 9]]  # longest suffix (1 2 3) first
    ids += [7, 7, 1, 2]  # (7, 1, 2) is new; (1, 2) last ended at 7 (in "1 2 3" of position 6..8)
    assert p.propose([ProposalRequest("a", ids, 2)]) == [[3, 7]]
    assert p.propose([ProposalRequest("b", [5, 6, 8], 4)]) == [[]]  # nothing repeats
    assert p.propose([ProposalRequest("c", [4, 4, 4, 4], 3)]) == [[4]]  # runs to the end of what is known
    p.forget(["a", "b", "c"])
    assert not p.indexes


def test_bad_ngram_sizes_are_a_clear_error():
    with pytest.raises(InvalidRequestError, match="ngram"):
        SpeculativeConfig("ngram", 4, ngram_min=3, ngram_max=2)


def test_ngram_decoding_is_the_plain_output_and_keeps_several_tokens_per_step(tiny_llama):
    kw = dict(dtype="float32", kv_cache_memory="2MiB", progress=False, max_num_batched_tokens=64)
    prompts = ["abc abc abc abc abc abc", "one two one two one two one two", "xyz"]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), **kw).generate(prompts, params, use_tqdm=False)]
    llm = LLM(str(tiny_llama), speculative_method="ngram", num_speculative_tokens=4, speculative_controller="off",
              **kw)
    assert "speculate  ngram" in llm.info.summary()
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == plain
    stats = llm.engine.spec_stats
    assert stats.proposed > 0 and stats.accepted > 0  # a random tiny model still loops on its own output
    llm.engine.kv.check_integrity()
