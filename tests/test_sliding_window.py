"""Per-layer sliding windows read as transformers applies them, and greedy parity past the window."""
from __future__ import annotations

import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.weights.hf_config import layer_windows
from tests.conftest import make_tiny_model
from tests.test_hf_parity import hf_greedy, hf_model

PROMPTS = ["The quick brown fox jumps over the lazy dog", "a", "0123456789 " * 4]


@pytest.mark.parametrize("cfg,arch,want", [
    ({"sliding_window": 8}, "MistralForCausalLM", (8, 8, 8)),
    ({"sliding_window": 8, "use_sliding_window": None}, "MistralForCausalLM", (8, 8, 8)),
    ({"sliding_window": 8, "use_sliding_window": False}, "MistralForCausalLM", (None,) * 3),
    ({"sliding_window": None}, "MistralForCausalLM", (None,) * 3),
    ({"sliding_window": 8, "max_window_layers": 1}, "Qwen2ForCausalLM", (None,) * 3),  # off by default
    ({"sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1}, "Qwen2ForCausalLM", (None, 8, 8)),
    ({"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
     "Qwen2ForCausalLM", (8, None, 8)),
    ({"sliding_window": 8, "sliding_window_pattern": 3}, "Gemma3ForCausalLM", (8, 8, None)),
])
def test_layer_windows_follow_the_config(cfg, arch, want):
    assert layer_windows({"num_hidden_layers": 3, **cfg}, arch) == want


@pytest.fixture(scope="module", params=["mistral", "qwen2"])
def windowed_model(request, tmp_path_factory):
    """Mistral: every layer has a window of 8; Qwen2: layer 0 attends to all, layers 1-2 have windows of 8."""
    extra = {"use_sliding_window": True, "max_window_layers": 1} if request.param == "qwen2" else {}
    folder = make_tiny_model(tmp_path_factory.mktemp(f"win-{request.param}"), request.param, seed=3,
                             num_hidden_layers=3, sliding_window=8, **extra)
    return request.param, folder


def test_engine_reads_each_layers_window(windowed_model):
    arch, folder = windowed_model
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB")
    got = [layer.self_attn.attn.window for layer in llm.engine.runner.model.model.layers]
    assert got == ([8, 8, 8] if arch == "mistral" else [None, 8, 8])


@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": 5}, {"attention_backend": "sdpa"}],
                         ids=["plain", "chunked", "sdpa"])
def test_greedy_matches_transformers_past_the_window(windowed_model, options):
    arch, folder = windowed_model
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", **options)
    ref = hf_model(folder)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(ref, llm.tokenizer.encode(prompt), 40), f"{arch}: {prompt!r}"
    llm.engine.kv.check_integrity()
