"""Per-expert load on synthetic routings with a known answer: counters per (layer, expert) in
/metrics' families and in the MoE bench report, and the imbalance max / mean. Two routings: counts
written into the counters directly, and a zeroed router (every expert scores the same: the k experts
torch.topk picks from a tie, as transformers does, take every token)."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model
from safetensors.torch import load_file, save_file

from ridgeline.bench import moe_report
from ridgeline.entrypoints.llm import LLM
from ridgeline.distributed import expert_load
from ridgeline.sampling_params import SamplingParams


def _llm(folder) -> LLM:
    return LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False)


def _families(model) -> dict:
    return {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
            for f in expert_load.metric_families(model)}


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("load-mixtral"), "mixtral")  # 4 experts, top-2, 2 layers


def test_synthetic_counts_reach_metrics_and_the_bench(mixtral):
    model = _llm(mixtral).engine.runner.model
    layers = expert_load.sparse_layers(model)
    for m, counts in zip(layers, ([6, 2, 0, 0], [2, 2, 2, 2])):  # imbalance 6 / 2 = 3 and 1
        m.reset_stats()
        m.load_counts.copy_(m.load_counts.new_tensor(counts))
    fams = _families(model)
    per_expert = fams["ridgeline_moe_expert_routed_pairs"]
    assert per_expert[(("expert", "0"), ("layer", "0"))] == 6 and per_expert[(("expert", "3"), ("layer", "1"))] == 2
    assert len(per_expert) == 8 and sum(per_expert.values()) == 16
    assert fams["ridgeline_moe_routed_pairs"] == {(): 16}
    assert fams["ridgeline_moe_expert_load_imbalance"] == {(("stat", "min"),): 1.0, (("stat", "mean"),): 2.0,
                                                          (("stat", "max"),): 3.0}
    stats = moe_report.collect(model, 1.0)
    assert stats["load_counts"] == {0: [6, 2, 0, 0], 1: [2, 2, 2, 2]}
    text = "\n".join(moe_report.lines(stats))
    assert "max / mean per layer: min 1.00, mean 2.00, max 3.00" in text and "load counts: 6 2 0 0" in text


def test_a_zeroed_router_sends_every_token_to_the_k_experts_a_tie_picks(tmp_path):
    folder = make_tiny_model(tmp_path / "zero", "mixtral")
    path = folder / "model.safetensors"
    tensors = load_file(path)
    routers = [k for k in tensors if k.endswith("block_sparse_moe.gate.weight")]
    assert len(routers) == 2
    for k in routers:
        tensors[k].zero_()
    save_file(tensors, path, metadata={"format": "pt"})
    llm = _llm(folder)
    model = llm.engine.runner.model
    moe_report.reset(model)
    prompts = [[5, 6, 7, 8, 9] * 3, [100, 120, 140]]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    tokens = sum(map(len, prompts)) + 2 * 2  # prompts, then 2 decode rows each (the 3rd token is not run)
    stats = moe_report.collect(model, 1.0)
    picked = set(torch.topk(torch.softmax(torch.zeros(1, 4), -1), 2).indices[0].tolist())
    want = [tokens if e in picked else 0 for e in range(4)]
    assert stats["load_counts"] == {0: want, 1: want}
    assert stats["imbalance_max_over_mean"] == {"min": 2.0, "mean": 2.0, "max": 2.0}  # E / k
    assert stats["experts_touched_per_call"] == 2.0
    assert stats["expert_bytes_per_step"] == 2 * 2 * stats["expert_bytes"]  # 2 experts in each of 2 layers
    assert stats["steps"] == stats["layer_calls"] // 2
    assert any("per engine step" in line and "MiB of experts touched" in line for line in moe_report.lines(stats))


def test_the_step_line_sets_achieved_bandwidth_beside_the_measured_peak():
    stats = {"expert_bytes_per_step": 10 * 2**20, "step_ms": 2.0, "steps": 5, "expert_gb_per_s": 5.0,
             "peak_gb_per_s": 20.0, "peak_threads": 2}
    line = moe_report._step_line(stats)
    assert "10.0 MiB of experts touched in 2.00 ms = 5.00 GB/s achieved" in line
    assert "read peak on 2 threads 20.0 GB/s would read them in 0.52 ms (25% of it achieved)" in line
    assert "no measured read peak" in moe_report._step_line(stats | {"peak_gb_per_s": None})
