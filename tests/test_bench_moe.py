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


def test_gpt_oss_random_model_is_an_mxfp4_checkpoint(tmp_path):
    """gpt-oss-20b's preset writes its checkpoint layout directly (MXFP4 expert blocks, bf16 elsewhere, the
    head size kept while widths divide, every width whole blocks of 32), and it loads with the blocks kept."""
    cls, cfg = scaled_config("gpt-oss-20b", 8, 2)
    assert cls == "GptOssConfig" and cfg["head_dim"] == 64 and cfg["hidden_size"] % 32 == 0
    out = tmp_path / "oss"
    cmd_random_model(argparse.Namespace(output=str(out), like="gpt-oss-20b", divide=8, layers=2, seed=0))
    llm = LLM(str(out), dtype="float32", kv_cache_memory="4MiB", max_model_len=256, progress=False)
    assert "mxfp4 (checkpoint blocks) x 128" in llm.info.weight_formats  # 2 layers x 32 experts x 2
    assert llm.info.quantization == "mxfp4 (checkpoint)"
    # a decode step reads 4 of each layer's 32 experts: the bench's floor counts those, not all of them
    model = llm.engine.runner.model
    experts = sum(lin.format.weight_bytes(lin) for layer in model.model.layers for _, ex in layer.mlp.expert_items()
                  for lin in (ex.gate_up_proj, ex.down_proj))
    assert abs(llm.info.weight_bytes_per_token - (llm.info.weight_bytes - experts * 28 // 32)) <= 2  # per-layer rounding
    assert all(p is None for p in llm.info.layer_paths) or not llm.info.kernel_plan.c_stack
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
