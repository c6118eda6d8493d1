"""Long prompts end to end: greedy parity with transformers past 3,000 tokens (float32, a tiny random
Llama-architecture model with one KV head; the default model's own check on held-out text is
tests/test_default_model.py), prefilled in the engine's chunks through the tiled prefill kernel."""
from __future__ import annotations

import torch

from ridgeline import LLM, SamplingParams
from conftest import make_tiny_model
from test_hf_parity import hf_greedy, hf_model


def test_greedy_parity_with_transformers_past_3000_tokens(tmp_path):
    folder = make_tiny_model(tmp_path / "long", "llama", max_position_embeddings=4096, num_key_value_heads=1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 300, (3200,), generator=g).tolist()
    steps = 8
    want = hf_greedy(hf_model(folder), prompt, steps)
    for budget in (512, 4096):  # chunked prefill, and the whole prompt in one step
        llm = LLM(str(folder), dtype="float32", max_num_batched_tokens=budget, progress=False)
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True), use_tqdm=False)
        assert list(out[0].outputs[0].token_ids) == want
