"""Quantized KV caches in the engine: capacity follows the format; a tiny model's greedy output with
int8 KV equals float KV over short generations; the C decoder stack runs quantized KV layers and
equals the module path bit for bit; chunked prefill, prefix caching (cached blocks stay quantized),
preemption, n > 1 and multi-token steps leave output identical to the plain engine with the same
KV format; bad values are clear errors."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_gemm
from ridgeline.formats import kv as kvq
from conftest import make_tiny_model

PROMPTS = ["Once upon a time", "The meaning of life is " * 6, "x", "abcdefghijklmnopqrstuvwxyz" * 3]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _ids(llm: LLM, prompts=PROMPTS, params=GREEDY):
    return [c.token_ids for o in llm.generate(prompts, params, use_tqdm=False) for c in o.outputs]


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """head_dim 64, as the default model's (int4 groups of 32, the AVX-512 attention paths)."""
    return make_tiny_model(tmp_path_factory.mktemp("wide"), "llama", hidden_size=256, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=256)


def test_capacity_follows_the_format(wide):
    infos = {d: LLM(str(wide), dtype="bfloat16", kv_cache_memory="4MiB", kv_cache_dtype=d, progress=False).info
             for d in ("auto", "int8", "int4", "fp8")}
    base = infos["auto"].kv_capacity_tokens
    assert infos["auto"].kv_spec.format.name == "bf16"
    assert infos["int8"].kv_capacity_tokens / base > 1.9 and infos["fp8"].kv_capacity_tokens / base > 1.9
    assert infos["int4"].kv_capacity_tokens / base > 3.5
    summary = infos["int8"].summary()
    assert "int8" in summary and "1.94x the tokens of bfloat16" in summary and "max concurrency" in summary
    assert all(p is None for p in infos["int4"].layer_paths) or not infos["int4"].kernel_plan.c_stack


def test_float16_is_stored_as_float16(wide):
    llm = LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype="float16", progress=False)
    kv = llm.engine.runner.kv[0]
    assert kv.k.dtype == torch.float16 and llm.info.kv_spec.bytes_per_token == 2 * 2 * 2 * 64 * 2
    f32 = LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", progress=False)
    assert _ids(llm)[:2] == _ids(f32)[:2]


def test_int8_greedy_output_equals_float(tiny_model):
    """Token for token up to the first near-tie of the float run (a top-2 logprob margin under 0.05,
    which int8's ~1% error may legitimately flip; random tiny models have a few)."""
    _, folder = tiny_model
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    f32 = [c for o in LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False).generate(
        PROMPTS, params, use_tqdm=False) for c in o.outputs]
    i8 = _ids(LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype="int8", progress=False),
              params=params)
    compared = 0
    for want, got in zip(f32, i8):
        clear = next((i for i, lp in enumerate(want.logprobs) if lp.top[0][1] - lp.top[1][1] < 0.05), 8)
        assert got[:clear] == want.token_ids[:clear]
        compared += clear
    assert compared >= 16


@pytest.mark.parametrize("k_dtype,v_dtype", [("int8", "int8"), ("int4", "int4"), ("fp8_e4m3", "fp8_e5m2"),
                                             ("int4", "bfloat16"), ("float16", "float16")])
def test_stack_equals_the_module_path_with_quantized_kv(wide, k_dtype, v_dtype):
    if not cpu_gemm.available(torch.bfloat16):
        pytest.skip("this CPU has no packed bf16 kernel, so no C stack")
    llm = LLM(str(wide), dtype="bfloat16", kv_cache_memory="4MiB", max_num_batched_tokens=24,
              enable_prefix_caching=False, kv_cache_dtype_k=k_dtype, kv_cache_dtype_v=v_dtype, progress=False)
    assert all(p is None for p in llm.info.layer_paths), llm.info.layer_report()  # never a module fallback
    model = llm.engine.runner.model.model
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)

    def run():
        return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for o in llm.generate(PROMPTS, params,
                                                                                        use_tqdm=False)
                for c in o.outputs]

    with_stack = run()
    segments, model.segments = model.segments, [(0, len(model.layers), False)]
    try:
        assert run() == with_stack
    finally:
        model.segments = segments


def test_sdpa_backend_agrees_with_the_c_kernel_on_int8(wide):
    c = LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype="int8", progress=False)
    t = LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype="int8", attention_backend="sdpa",
            progress=False)
    assert c.engine.runner.model.model.layers[0].self_attn.attn.backend.name == "paged_c"
    assert _ids(c)[:2] == _ids(t)[:2]


def test_sdpa_backend_agrees_with_the_c_kernel_on_int4(wide):
    """Both read the position-0 key with its own center added back (kv_cache.py k_centers)."""
    c = LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype="int4", progress=False)
    t = LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype="int4", attention_backend="sdpa",
            progress=False)
    assert _ids(c)[:2] == _ids(t)[:2]


@pytest.mark.parametrize("kv_dtype", ["int8", "int4"])
def test_engine_features_leave_quantized_output_identical(wide, kv_dtype):
    """Chunked prefill, prefix caching (hits read the quantized blocks), preemption and n > 1 against
    one plain run with the same KV format."""
    prompts = ["shared system prompt, then a question " * 4 + str(i) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = _ids(LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype=kv_dtype,
                     enable_prefix_caching=False, progress=False), prompts, params)
    for kw in ({"max_num_batched_tokens": 16}, {"enable_prefix_caching": True},
               {"kv_cache_memory": "192KiB", "block_size": 4}):
        llm = LLM(str(wide), dtype="float32", kv_cache_dtype=kv_dtype, progress=False,
                  **{"kv_cache_memory": "4MiB", **kw})
        assert _ids(llm, prompts, params) == plain, kw
        if "block_size" in kw:
            assert llm.engine.scheduler.num_preemptions > 0
        llm.engine.kv.check_integrity()
    cached = LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype=kv_dtype, progress=False)
    _ids(cached, prompts, params)
    again = cached.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == plain and all(o.num_cached_tokens > 0 for o in again)
    n2 = cached.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, n=2),
                         use_tqdm=False)
    assert [c.token_ids for o in n2 for c in o.outputs] == [plain[0], plain[0], plain[1], plain[1]]


def test_ngram_proposals_keep_quantized_output(wide):
    prompts = ["a b c d a b c d a b c d a b", "1 2 3 1 2 3 1 2 3 1 2"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = _ids(LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype="int8", progress=False),
                 prompts, params)
    spec = LLM(str(wide), dtype="float32", kv_cache_memory="4MiB", kv_cache_dtype="int8", progress=False,
               speculative_method="ngram", num_speculative_tokens=3, speculative_controller="off")
    assert _ids(spec, prompts, params) == plain
    assert spec.engine.spec_stats.proposed > 0


def test_bad_kv_cache_dtypes_are_clear_errors(tiny_llama, tmp_path):
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype must be one of auto, float32"):
        LLM(str(tiny_llama), kv_cache_dtype="int3")
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype_v must be one of"):
        LLM(str(tiny_llama), kv_cache_dtype_v="q8_0")
    odd = make_tiny_model(tmp_path / "odd", "llama", hidden_size=48, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(InvalidRequestError, match="int4 quantizes groups of 32 .* head_dim is 24; this model takes"):
        LLM(str(odd), kv_cache_dtype="int4")


def test_command_line_flags_reach_the_config():
    """Every command that loads a model (serve, generate, bench) takes the flags through add_engine_args."""
    from ridgeline.cli import build_parser, engine_kwargs
    from ridgeline.config import EngineConfig
    args = build_parser().parse_args(["generate", "hi", "--kv-cache-dtype", "int8", "--kv-cache-dtype-k", "int4"])
    cache = EngineConfig.from_kwargs("m", **engine_kwargs(args)).cache
    assert (cache.k_dtype, cache.v_dtype) == ("int4", "int8")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "hi", "--kv-cache-dtype", "q4_0"])


def test_int4_keys_are_centered_from_the_calibration_text(wide):
    llm = LLM(str(wide), dtype="float32", kv_cache_dtype="int4", kv_cache_memory="2MiB", progress=False)
    shifts = [kv.k_shift for kv in llm.engine.runner.kv]
    assert all(s is not None and s.abs().sum() > 0 for s in shifts)
    for kv in llm.engine.runner.kv:  # position 0 (the attention sink) has a center of its own
        shift, sink, offset = kv.k_centers
        assert not torch.equal(sink, shift)
        torch.testing.assert_close(kvq.hadamard(offset), sink - shift)  # read back in K's rotated basis
    assert llm.engine.kv.num_used_blocks == 0 and llm.engine.kv.num_cached_blocks == 0
    llm.engine.kv.check_integrity()
    v_only = LLM(str(wide), dtype="float32", kv_cache_dtype_v="int4", kv_cache_memory="2MiB", progress=False)
    assert all(kv.k_shift is None for kv in v_only.engine.runner.kv)  # centering is for K
