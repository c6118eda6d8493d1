"""Advisor arithmetic against textbook numbers and published model sizes (no torch, no engine)."""
from __future__ import annotations

import pytest

from ridgeline.advisor import speculative as sp
from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.hardware import lookup_hardware
from ridgeline.advisor.memory import kv_bytes_per_token, min_devices, weight_bytes
from ridgeline.advisor.model_config import resolve_spec, spec_from_hf
from ridgeline.advisor.parallel import check_fits, choose_layout
from ridgeline.advisor.roofline import Platform, crossover_len, decode_step, prefill, ridge_batch
from ridgeline.advisor.scenario import build
from ridgeline.advisor.techniques import prefix_cache, ranked
from ridgeline.advisor.workload import Workload

H100 = lookup_hardware("H100")
TINY_KV = Workload(prompt_len=16, output_len=16, concurrency=1)


@pytest.mark.parametrize("name, params, active", [
    ("SmolLM2-135M", 134_515_008, None),  # MACHINE.md
    ("Llama-3.1-8B", 8.03e9, None),
    ("Llama-3.1-70B", 70.55e9, None),
    ("Llama-3.1-405B", 405.85e9, None),
    ("Qwen2.5-7B", 7.62e9, None),
    ("Qwen2.5-72B", 72.7e9, None),
    ("Mistral-7B-v0.3", 7.25e9, None),
    ("Mixtral-8x7B", 46.7e9, 12.9e9),
    ("DeepSeek-V3", 671e9, 37.5e9),
])
def test_parameter_counts_match_published_sizes(name, params, active):
    spec = resolve_spec(name)
    assert spec.num_params == pytest.approx(params, rel=0.005)
    assert spec.active_params == pytest.approx(active or params, rel=0.005)


def test_70b_fp16_weights_and_decode_floor_on_one_h100():
    spec = resolve_spec("llama-3.1-70b")
    assert weight_bytes(spec, "fp16") == pytest.approx(140e9, rel=0.01)
    one_gpu = Platform(spec, H100, "fp16", "fp16")
    assert decode_step(one_gpu, 1, 0).memory == pytest.approx(0.042, rel=0.02)  # 140 GB / 3.35 TB/s
    assert decode_step(one_gpu.with_(weights="int8"), 1, 0).memory == pytest.approx(0.021, rel=0.02)
    assert decode_step(one_gpu, 1, 0).bound == "bandwidth"


def test_speculative_expected_tokens_and_collapse_past_the_ridge():
    assert sp.expected_tokens(0.8, 4) == pytest.approx(3.3616)
    assert sp.batch1_gain(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    pl = Platform(resolve_spec("Llama-3.1-8B"), H100)
    assert sp.gain(pl, 1, 512, 0.8, 4, 0.05) == pytest.approx(sp.batch1_gain(0.8, 4, 0.05), rel=0.05)
    assert sp.gain(pl, 4096, 512, 0.8, 4, 0.05) < 1
    be = sp.break_even_batch(pl, 512, 0.8, 4, 0.05)
    assert be is not None and 1 < be < 4096
    with pytest.raises(AdvisorError):
        sp.expected_tokens(1.0, 4)


def test_kv_bytes_per_token_is_gqa_and_mla_aware():
    llama70 = resolve_spec("Llama-3.1-70B")
    assert kv_bytes_per_token(llama70, "fp16") == 327_680 == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_per_token(llama70, "fp8") == 163_840
    assert kv_bytes_per_token(resolve_spec("SmolLM2-135M"), "bf16") == 2 * 30 * 3 * 64 * 2
    assert kv_bytes_per_token(resolve_spec("DeepSeek-V3"), "bf16") == 61 * (512 + 64) * 2


@pytest.mark.parametrize("prec, capacity, deployed", [("fp8", 6, 8), ("bf16", 12, 16)])
def test_minimum_h100s_for_405b(prec, capacity, deployed):
    spec = resolve_spec("Llama-3.1-405B")
    w = Workload(prompt_len=16, output_len=16, concurrency=1, weight_precision=prec)
    assert min_devices(spec, H100, w, 1) == capacity  # ceil(405.9 or 811.7 GB / (80 GB * 0.9))
    layout = choose_layout(spec, H100, w, capacity, 1)
    assert (layout.devices, layout.tp) == (deployed, 8)
    assert layout.pp == deployed // 8


def test_ridge_batch_and_attention_crossover():
    pl = Platform(resolve_spec("Llama-3.1-70B"), H100)
    # weights only: B* = F / BW * bytes / 2 = 989e12 / 3.35e12 = 295
    assert ridge_batch(pl, 0) == pytest.approx(989 / 3.35, rel=0.03)
    assert ridge_batch(pl, 1000) > ridge_batch(pl, 0)  # KV reads push the ridge out
    assert crossover_len(pl.spec) == pytest.approx(104_000, rel=0.02)
    assert prefill(pl, 4096).bound == "compute"


def test_moe_reads_more_experts_as_the_batch_grows():
    spec = resolve_spec("Mixtral-8x7B")
    assert spec.params_read(1) < spec.params_read(8) < spec.num_params
    assert spec.experts_touched(1) == pytest.approx(2)
    assert spec.experts_touched(64) == pytest.approx(8, rel=0.01)


def test_prefix_caching_gain_grows_with_f():
    spec = resolve_spec("Llama-3.1-8B")
    gains = [prefix_cache(build(spec, H100, Workload(prompt_len=8000, prefix_share=f))).gain for f in (0, 0.5, 0.9)]
    assert gains[0] == pytest.approx(1.0)
    assert gains[1] == pytest.approx(2.0, rel=0.15) and gains[2] > gains[1]


def test_walls():
    llama70 = resolve_spec("Llama-3.1-70B")
    from ridgeline.advisor.diagnose import diagnose
    assert diagnose(build(llama70, H100, Workload(), gpus=1)).name == "capacity"
    assert diagnose(build(resolve_spec("Llama-3.1-8B"), H100, Workload(concurrency=4))).name == "bandwidth"
    long_prompts = Workload(prompt_len=32000, output_len=200, concurrency=64, tpot_slo=0.04, ttft_slo=30)
    wall = diagnose(build(resolve_spec("Llama-3.1-8B"), H100, long_prompts))
    assert wall.name == "slo-contention"
    names = [t.name for t in ranked(build(resolve_spec("Llama-3.1-8B"), H100, long_prompts))]
    assert names[0].startswith(("chunked prefill", "prefill/decode"))


def test_tp_over_pcie_is_a_trap_only_when_collectives_rival_the_step():
    spec, w = resolve_spec("Llama-3.1-70B"), Workload(concurrency=64, weight_precision="int4")
    pcie = choose_layout(spec, lookup_hardware("RTX-4090"), w, 2, 64)
    assert (pcie.tp, pcie.pp) == (1, 2) and "pipeline" in pcie.reason
    nvlink = choose_layout(spec, H100, w, 2, 64)
    assert (nvlink.tp, nvlink.pp) == (2, 1)
    slow_memory = choose_layout(spec, lookup_hardware("L4"), w, 2, 64)  # long steps hide the all-reduces
    assert slow_memory.tp == 2


def test_cannot_fit_on_any_count():
    with pytest.raises(AdvisorError, match="cannot fit on any count of L4"):
        check_fits(resolve_spec("Llama-3.1-405B"), lookup_hardware("L4"), Workload(weight_precision="fp32"), 1)
    with pytest.raises(AdvisorError, match="Ryzen"):
        check_fits(resolve_spec("Llama-3.1-70B"), lookup_hardware("Ryzen-7950X"), TINY_KV, 1)


def test_config_dict_errors_name_the_field():
    with pytest.raises(AdvisorError, match="'num_hidden_layers'"):
        spec_from_hf({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
                      "vocab_size": 10, "max_position_embeddings": 64}, "x")
    with pytest.raises(AdvisorError, match="positive integer"):
        Workload(prompt_len=0)
    with pytest.raises(AdvisorError, match="known: H100-SXM"):
        lookup_hardware("tpu-v9")
    with pytest.raises(AdvisorError, match="Llama-3.1-70B"):
        resolve_spec("gpt-17")
    with pytest.raises(AdvisorError, match="maximum context"):
        build(resolve_spec("SmolLM2-135M"), H100, Workload(prompt_len=8000, output_len=500))


def test_name_lookup_is_forgiving():
    assert resolve_spec("meta-llama/Llama-3.1-8B-Instruct").name == "Llama-3.1-8B"
    assert resolve_spec("qwen2.5-72b").num_layers == 80
    assert lookup_hardware("h100").name == "H100-SXM"


def test_measured_gemm_curve_sets_the_rate_per_row_count():
    from dataclasses import replace
    curve = {"bf16": {1: 10e9, 16: 160e9, 256: 400e9}}
    hw = replace(lookup_hardware("H100"), gemm_curve=curve)
    assert hw.rate_at("bf16", 1) == 10e9 and hw.rate_at("bf16", 0.5) == 10e9
    assert hw.rate_at("bf16", 4) == pytest.approx(40e9)  # log-linear between 1 and 16
    assert hw.rate_at("bf16", 16) == 160e9 and hw.rate_at("bf16", 4096) == 400e9
    assert lookup_hardware("H100").rate_at("bf16", 4) == H100.rate("bf16")  # no curve: the peak
    spec = resolve_spec("SmolLM2-135M")
    peak, measured = Platform(spec, H100), Platform(spec, hw)
    assert decode_step(measured, 16, 64).compute == pytest.approx(
        decode_step(peak, 16, 64).compute * H100.rate("bf16") / 160e9)
