"""A row's result never depends on where the scheduler cut the prompt: every prompt row takes the
prompt attention kernel, whatever chunk it falls in, even a chunk of one token; rows past the prompt
take the decode kernel, whatever step they are computed in. Without that, a near-tie in the logits
flips with the step's composition, and speculative decoding (whose steps differ from plain ones)
stops being token-for-token the plain engine."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams

PROMPT = list(range(5, 5 + 45))


def _logits_by_step(folder, dtype: str, budget: int) -> list[torch.Tensor]:
    llm = LLM(str(folder), dtype=dtype, kv_cache_memory="4MiB", max_num_batched_tokens=budget,
              enable_prefix_caching=False)
    model, seen = llm.engine.runner.model, []
    plain = model.compute_logits

    def capture(hidden):
        logits = plain(hidden)
        seen.append(logits[-1].float().clone())
        return logits

    model.compute_logits = capture
    llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    return seen


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_one_token_prompt_chunk_gives_the_same_bits(tiny_llama, dtype):
    whole = _logits_by_step(tiny_llama, dtype, 256)
    for budget in (len(PROMPT) - 1, 22, 16):  # last chunks of 1, 1 and 13 tokens
        cut = _logits_by_step(tiny_llama, dtype, budget)
        assert len(cut) == len(whole)
        for step, (a, b) in enumerate(zip(whole, cut)):
            assert torch.equal(a, b), f"budget {budget}: step {step} differs by {(a - b).abs().max():.3g}"
