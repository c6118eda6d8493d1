"""Drafts drawn from the EAGLE head's q for sampling requests (spec/sampled_drafts.py): q follows the
request's temperature, top-k, min-p and top-p; a draw never lands on a zero; in the engine every
sampled draft comes with q rows that sum to 1 and give its tokens q > 0, greedy requests keep the
head's argmax, and seeded requests repeat. (That verified outputs keep the target's distribution:
tests/test_spec_distribution.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.speculative.sampled_drafts import draft_distribution, draw
from ridgeline.runner.draft import Draft

LOGITS = np.log(np.array([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=np.float32))


def test_the_draft_distribution_follows_the_request():
    same = draft_distribution(LOGITS, SamplingParams(temperature=1.0))
    assert np.allclose(same, [0.5, 0.25, 0.125, 0.0625, 0.0625])
    hot = draft_distribution(LOGITS, SamplingParams(temperature=2.0))
    assert np.allclose(hot, np.sqrt(same) / np.sqrt(same).sum())
    assert np.allclose(draft_distribution(LOGITS, SamplingParams(top_k=2)), [2 / 3, 1 / 3, 0, 0, 0])
    assert np.allclose(draft_distribution(LOGITS, SamplingParams(min_p=0.3)), [2 / 3, 1 / 3, 0, 0, 0])
    # the nucleus: the smallest top set reaching top_p (0.5 + 0.25 >= 0.7), its first token always in
    assert np.allclose(draft_distribution(LOGITS, SamplingParams(top_p=0.7)), [2 / 3, 1 / 3, 0, 0, 0])
    assert np.allclose(draft_distribution(LOGITS, SamplingParams(top_p=0.1)), [1, 0, 0, 0, 0])


def test_a_draw_follows_q_and_never_lands_on_a_zero():
    q = np.array([0.0, 0.25, 0.0, 0.75, 0.0])
    assert [draw(q, u) for u in (0.0, 0.2499, 0.25, 0.9999)] == [1, 1, 3, 3]
    rng = np.random.default_rng(0)
    counts = np.bincount([draw(q, u) for u in rng.random(4000)], minlength=5)
    assert counts[[0, 2, 4]].sum() == 0 and abs(counts[3] / 4000 - 0.75) < 0.03


@pytest.fixture
def eagle_llm(tiny_llama, tiny_head):
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              speculative_controller="off", dtype="float32", kv_cache_memory="2MiB", progress=False)
    proposer, propose, seen = llm.engine.proposer, llm.engine.proposer.propose, []

    def recording(reqs):
        out = propose(reqs)
        seen.extend(zip(reqs, out))
        return out
    proposer.propose = recording
    return llm, seen


def test_sampling_requests_get_drafts_with_q(eagle_llm):
    llm, seen = eagle_llm
    prompts = ["The meaning of life is", "Once upon a time"]
    params = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, ignore_eos=True, seed=5),
              SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)]
    llm.generate(prompts, params, use_tqdm=False)
    sampled = [d for r, d in seen if not r.params.greedy and d]  # a Draft, or [] where the chain stopped at once
    greedy = [d for r, d in seen if r.params.greedy and d]
    assert sampled and all(isinstance(d, Draft) for d in sampled)
    assert greedy and not any(isinstance(d, Draft) for d in greedy)
    for d in sampled:
        assert torch.allclose(d.probs.sum(-1), torch.ones(len(d.probs), device=d.probs.device), atol=1e-5)
        assert bool((d.q_at(torch.tensor(d.token_ids, device=d.probs.device)) > 0).all())


def test_seeded_sampling_repeats_with_drafts(eagle_llm):
    llm, _ = eagle_llm
    params = [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=s) for s in range(6)]
    first = [o.outputs[0].token_ids for o in llm.generate(["The quick brown fox"] * 6, params, use_tqdm=False)]
    again = [o.outputs[0].token_ids for o in llm.generate(["The quick brown fox"] * 6, params, use_tqdm=False)]
    assert first == again and llm.engine.spec_stats.proposed > 0


def test_a_seeded_request_repeats_whatever_runs_beside_it(eagle_llm):
    """Its draws follow its own chain only: a chain of another request that runs longer (a greedy
    one here) takes none of its generator's numbers."""
    llm, _ = eagle_llm
    prompts = ["The quick brown fox", "one two three one two three one two three", "Once upon a time"]
    seeded = [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=s) for s in range(4)]
    alone = [llm.generate(prompts[:1], [p], use_tqdm=False)[0].outputs[0].token_ids for p in seeded]
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for p, want in zip(seeded, alone):
        out = llm.generate(prompts, [p, greedy, greedy], use_tqdm=False)
        assert out[0].outputs[0].token_ids == want
