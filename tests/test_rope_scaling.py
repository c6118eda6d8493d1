"""RoPE scaling kinds against transformers' rope init functions, the --rope-scaling override end to
end, and --max-model-len past the trained length (a warning, not an error)."""
from __future__ import annotations

import logging

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError
from ridgeline.layers.rope_scaling import inv_freq, parse_override
from conftest import make_tiny_model
from test_hf_parity import engine_logits, hf_model

CASES = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0},
    {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2, "truncate": False},
    {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.3, "original_max_position_embeddings": 256},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 128},
]


@pytest.mark.parametrize("scaling", CASES, ids=lambda s: "-".join(f"{v}" for v in s.values()))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_frequencies_match_transformers(scaling, head_dim):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    max_pos, theta, max_len = 512, 10000.0, 2048
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      max_position_embeddings=max_pos, rope_parameters={**scaling, "rope_theta": theta})
    want, want_att = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu", seq_len=max_len)
    ours = {"original_max_position_embeddings": max_pos, **scaling}
    got, att = inv_freq(head_dim, theta, ours, max_len)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-6, atol=0)
    assert att == pytest.approx(want_att, rel=1e-6)


@pytest.mark.parametrize("text,match", [
    ("{", "JSON object"), ("[1]", "JSON object"), ('{"rope_type": "longrope", "factor": 2}', "not supported"),
    ('{"type": "yarn"}', "needs factor"), ('{"rope_type": "linear", "factor": -1}', "positive"),
    ('{"rope_type": "linear", "factor": 0.5}', ">= 1"), ('{"rope_type": "yarn", "factor": 2, "fudge": 1}', "unknown"),
    ('{"rope_type": "llama3", "factor": 8}', "low_freq_factor"),
])
def test_bad_overrides_are_clear_errors(text, match):
    with pytest.raises(InvalidRequestError, match=match):
        parse_override(text)


def test_override_matches_transformers_with_that_scaling(tmp_path):
    """A model trained without scaling, run with --rope-scaling yarn: the logits transformers computes
    for the same weights with that rope_parameters (prompts past the original length)."""
    scaling = {"rope_type": "yarn", "factor": 4.0}
    plain = make_tiny_model(tmp_path / "plain", "llama", max_position_embeddings=64)
    scaled = make_tiny_model(tmp_path / "yarn", "llama", max_position_embeddings=64,
                             rope_parameters={**scaling, "rope_theta": 10000.0})
    llm = LLM(str(plain), dtype="float32", rope_scaling=scaling, progress=False)
    assert llm.engine.max_model_len == 256  # original length x factor
    ids = [list(range(5, 205)), list(range(40, 47))]
    got = engine_logits(llm, ids, chunk=96)
    model = hf_model(scaled)
    for g, p in zip(got, ids):
        with torch.no_grad():
            want = model(torch.tensor([p])).logits[0]
        torch.testing.assert_close(g, want, atol=2e-4, rtol=1e-4)


def test_max_model_len_past_the_trained_length_warns_and_runs(tiny_llama, caplog):
    with caplog.at_level(logging.WARNING, logger="ridgeline.engine"):
        llm = LLM(str(tiny_llama), dtype="float32", max_model_len=700, progress=False)
    assert llm.engine.max_model_len == 700
    assert any("exceeds the 512 tokens" in r.getMessage() for r in caplog.records)
    out = llm.generate([[3 + i % 300 for i in range(600)]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ridgeline.engine"):
        LLM(str(tiny_llama), dtype="float32", max_model_len=512, progress=False)
    assert not caplog.records
