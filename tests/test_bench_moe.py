"""The MoE benchmark's pieces: a random-weight model with Qwen3-30B-A3B's structure scaled down, and
the per-expert load / bytes-touched report of a run."""
from __future__ import annotations

import argparse

from ridgeline import LLM, SamplingParams
from ridgeline.bench import moe_report
from ridgeline.bench.random_model import cmd_random_model, scaled_config


def test_scaled_config_keeps_the_expert_structure():
    cls, cfg = scaled_config("qwen3-30b-a3b", 8, 12)
    assert cls == "Qwen3MoeConfig" and (cfg["num_experts"], cfg["num_experts_per_tok"]) == (128, 8)
    assert (cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_hidden_layers"]) == (256, 96, 12)
    assert cfg["num_attention_heads"] // cfg["num_key_value_heads"] == 8 and cfg["norm_topk_prob"]


def test_random_model_runs_and_reports_expert_load(tmp_path):
    out = tmp_path / "moe"
    cmd_random_model(argparse.Namespace(output=str(out), like="qwen3-30b-a3b", divide=32, layers=2, seed=0))
    llm = LLM(str(out), dtype="float32", kv_cache_memory="4MiB", progress=False)
    assert all(p is None for p in llm.info.layer_paths)
    model = llm.engine.runner.model
    moe_report.reset(model)
    prompts = [[5, 6, 7, 8, 9] * 4, [100, 120, 140]]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    stats = moe_report.collect(model, 1.0)
    tokens = sum(map(len, prompts)) + 2 * 2  # prompts, then 2 more decode rows each (the 3rd token is not run)
    assert stats["experts"] == 128 and stats["sparse_layers"] == 2
    assert stats["routed_pairs"] == 2 * tokens * 8
    assert all(sum(c) == tokens * 8 for c in stats["load_counts"].values())
    assert 8 <= stats["experts_touched_per_call"] <= 128
    assert stats["expert_bytes_touched"] == stats["experts_touched_per_call"] * stats["layer_calls"] * \
        stats["expert_bytes"]
    assert any("load counts" in line for line in moe_report.lines(stats))
