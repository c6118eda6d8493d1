"""Prompt logprobs: each prompt token's log-probability given the tokens before it, as
transformers computes it, whatever the chunking, with the prefix cache on (the whole prompt is
computed for such a request), and with max_tokens=0 (score only)."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError

PROMPT = "The quick brown fox jumps over the lazy dog, again and again."


def _hf_logprobs(folder, ids):
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)


def _table(out):
    return [None if lp is None else (lp.token_id, lp.logprob, [t for t, _ in lp.top]) for lp in out.prompt_logprobs]


@pytest.mark.parametrize("chunk", [512, 7])
def test_prompt_logprobs_match_transformers(tiny_model, chunk):
    _, folder = tiny_model
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="2MiB", max_num_batched_tokens=chunk, progress=False)
    [out] = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=3), use_tqdm=False)
    ids = out.prompt_token_ids
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    ref = _hf_logprobs(folder, ids)
    for pos in range(1, len(ids)):
        lp = out.prompt_logprobs[pos]
        assert lp.token_id == ids[pos]
        assert abs(lp.logprob - float(ref[pos - 1, ids[pos]])) < 1e-3
        assert [t for t, _ in lp.top] == ref[pos - 1].topk(3).indices.tolist()


def test_prefix_cache_hits_do_not_skip_prompt_rows(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", progress=False)
    plain = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    scored = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=0)
    first = llm.generate(PROMPT, plain, use_tqdm=False)[0]
    [out] = llm.generate(PROMPT, scored, use_tqdm=False)  # its prompt is cached, but its rows are needed
    assert out.num_cached_tokens == 0 and all(lp is not None for lp in out.prompt_logprobs[1:])
    assert out.outputs[0].token_ids == first.outputs[0].token_ids
    again = llm.generate(PROMPT, plain, use_tqdm=False)[0]
    assert again.num_cached_tokens > 0 and again.prompt_logprobs is None
    n2 = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=1, n=2),
                      use_tqdm=False)[0]
    assert [t and t[:2] for t in _table(n2)] == [t and t[:2] for t in _table(out)]  # choice 0 scores it
    assert [c.token_ids for c in n2.outputs] == [first.outputs[0].token_ids] * 2
    llm.engine.kv.check_integrity()


def test_max_tokens_zero_needs_prompt_logprobs():
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
    with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
