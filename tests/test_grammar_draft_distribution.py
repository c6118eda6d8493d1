"""Grammar drafts under sampling: a constrained request sampled with `grammar` drafts follows the same
distribution as without speculation (two-sample chi-square over the choices, thousands of seeded
requests), the drafts are accepted, and a seeded request repeats exactly with the same draft length
(forced positions still draw the sampler's noise: the draws are not those of the plain engine)."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.structured_params import StructuredOutputs
from stats_helpers import chi2_two_sample_pvalue

# shared beginnings and long forced tails: "hel" then a choice, the rest of each forced
CHOICES = ["hello world", "help me now", "helium gas", "yellow", "yes sir", "nope never", "no"]
KW = dict(dtype="float32", kv_cache_memory="8MiB", progress=False, max_num_seqs=256, max_num_batched_tokens=2048)
N = 1500


def sample(llm: LLM, seeds: range) -> list[str]:
    ps = [SamplingParams(temperature=1.5, seed=s, max_tokens=32, structured=StructuredOutputs(choice=CHOICES))
          for s in seeds]
    return [o.outputs[0].text for o in llm.generate(["Pick: "] * len(ps), ps, use_tqdm=False)]


@pytest.fixture(scope="module")
def outputs(tiny_llama):
    plain = LLM(str(tiny_llama), **KW)
    drafted = LLM(str(tiny_llama), speculative_method="grammar", num_speculative_tokens=4,
                  speculative_controller="off", **KW)
    return plain, drafted, sample(plain, range(N)), sample(drafted, range(N, 2 * N))


def test_grammar_drafts_keep_the_masked_distribution(outputs):
    _, drafted, a, b = outputs
    assert set(a) <= set(CHOICES) and set(b) <= set(CHOICES)
    ca = torch.tensor([a.count(c) for c in CHOICES], dtype=torch.float64)
    cb = torch.tensor([b.count(c) for c in CHOICES], dtype=torch.float64)
    assert int((ca >= 20).sum()) >= 3, f"too peaked a distribution to test: {ca.tolist()}"
    assert chi2_two_sample_pvalue(ca, cb) > 1e-3, (ca.tolist(), cb.tolist())
    stats = drafted.engine.spec_stats
    assert stats.proposed > 0 and stats.accepted > 0  # the forced tails were drafted and kept


def test_seeded_requests_repeat_with_grammar_drafts(outputs):
    _, drafted, _, b = outputs
    assert sample(drafted, range(N, N + 60)) == b[:60]
