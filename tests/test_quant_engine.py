"""--quantization through the engine: a tiny model's logits stay within a per-format bound of the float
model's, the C decoder stack and the module path agree bit for bit, the LM head is quantized while a
tied embedding stays a float table, and bad values are clear errors before any weight is read."""
import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.config import EngineConfig
from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_quant
from ridgeline.layers.forward_context import forward_context
from ridgeline.step_plan import ScheduledSeq
from conftest import make_tiny_model

PROMPTS = ["Once upon a time", "The meaning of life is " * 4, "x", "abcdefghijklmnopqrstuvwxyz" * 2]
PROMPT_IDS = [[5, 9, 33, 120, 7, 7, 8], [200, 3], list(range(40, 100))]
# max |logit - float logit| / max |float logit| over 69 rows of the tiny random model (measured 0.010 int8,
# 0.156-0.168 int4: 4 bits on Gaussian weights), and the share of rows whose top token agrees (0.99; 0.91-0.97)
BOUNDS = {"int8": (0.03, 0.95), "int4": (0.3, 0.85)}
SETTINGS = [("int8", None, False), ("int4", None, False), ("int4", 64, True), ("int4", 32, True),
            ("int4", 64, False)]


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """qwen2: tied embeddings and qkv bias; hidden 64, intermediate 128."""
    return make_tiny_model(tmp_path_factory.mktemp("qtied"), "qwen2")


def _llm(folder, **kw):
    return LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False, **kw)


def _logits(llm) -> torch.Tensor:
    """Logits of every row of one prefill step over PROMPT_IDS (fresh KV blocks)."""
    runner, kv = llm.engine.runner, llm.engine.kv
    seqs = []
    for i, ids in enumerate(PROMPT_IDS):
        assert kv.allocate(f"s{i}", len(ids))
        seqs.append(ScheduledSeq(f"s{i}", 0, ids, list(kv.tables[f"s{i}"]), True, SamplingParams(), None, ids,
                                 len(ids)))
    ids, pos, ctx, _ = runner.prepare(seqs)
    try:
        with torch.inference_mode(), forward_context(ctx):
            return runner.model.compute_logits(runner.model(ids, pos))
    finally:
        for s in seqs:
            kv.free(s.req_id)


def _generate(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for o in llm.generate(PROMPTS, params, use_tqdm=False)
            for c in o.outputs]


@pytest.fixture(scope="module")
def float_logits(tied):
    return _logits(_llm(tied))


@pytest.mark.parametrize("quantization,group,sym", SETTINGS)
def test_quantized_model_is_close_to_float_and_the_stack_equals_modules(tied, float_logits, quantization, group,
                                                                        sym):
    llm = _llm(tied, quantization=quantization, quant_group_size=group, quant_symmetric=sym)
    model = llm.engine.runner.model
    name = llm.config.model.weight_format
    assert model.model.layers[1].mlp.down_proj.format.name == name
    assert model.lm_head.format.name == "int8"  # int4 too: a 4-bit head costs far more accuracy than it saves
    assert model.model.embed_tokens.weight.dtype == torch.float32  # the tied table stays float for the lookup
    logits = _logits(llm)
    rel = float((logits - float_logits).abs().max() / float_logits.abs().max())
    top = float((logits.argmax(-1) == float_logits.argmax(-1)).float().mean())
    assert 0 < rel < BOUNDS[quantization][0] and top >= BOUNDS[quantization][1], (rel, top)
    if cpu_quant.available(quantization) and llm.info.kernel_plan.c_stack:
        assert llm.info.layer_paths == (None, None)  # every layer in the one-call stack
    got = _generate(llm)
    inner = model.model
    segments, inner.segments = inner.segments, [(0, len(inner.layers), False)]
    try:
        assert _generate(llm) == got  # token ids and logprobs, exactly
    finally:
        inner.segments = segments


def test_start_up_names_the_format_and_the_weight_bytes(tied):
    plain, q8 = _llm(tied), _llm(tied, quantization="int8")
    assert "weights    f32 x 9:" in plain.info.summary()
    assert "weights    int8 x 9:" in q8.info.summary() and " MB in linear layers" in q8.info.summary()
    assert q8.info.weight_bytes < plain.info.weight_bytes * 0.3


def test_int4_takes_an_int8_head_unless_a_rule_says_otherwise(tied):
    llm = _llm(tied, quantization="int4", quant_group_size=64)
    assert llm.info.weight_formats == "int4-g64 x 8, int8 x 1"
    assert EngineConfig.from_kwargs("m", quantization="int4").model.format_rules == (("lm_head", "int8"),)
    assert EngineConfig.from_kwargs("m", quantization="int8").model.format_rules == ()


def test_layer_format_rules_win_over_quantization(tied):
    llm = _llm(tied, quantization="int4", layer_formats=[("lm_head", "int8"), ("model.layers.0.*", "f32")])
    model = llm.engine.runner.model
    assert model.lm_head.format.name == "int8"
    assert model.model.layers[0].self_attn.qkv_proj.format.name == "f32"
    assert model.model.layers[1].self_attn.qkv_proj.format.name == "int4"
    assert sorted(llm.info.weight_formats.split(", ")) == ["f32 x 4", "int4 x 4", "int8 x 1"]


@pytest.mark.parametrize("kw,match", [
    (dict(quantization="int3"), "quantization must be one of auto, none, int8, int4, w8a8, w4a8, fp8, mxfp8, mxfp4, nvfp4, gguf, gguf-a8, gptq, "
     "awq"),
    (dict(quantization="int4", quant_group_size=48), "quant_group_size must be one of 32, 64, 128"),
    (dict(quantization="int8", quant_group_size=64), "applies to int4 and w4a8 only"),
    (dict(quantization="w8a8", quant_group_size=32), "applies to int4 and w4a8 only"),
    (dict(quant_symmetric=True), "quant_symmetric needs a quantization"),
])
def test_bad_values_are_clear_errors(kw, match):
    with pytest.raises(InvalidRequestError, match=match):
        EngineConfig.from_kwargs("smollm2-135m", **kw)


def test_none_means_no_quantization():
    assert EngineConfig.from_kwargs("m", quantization=None).model.weight_format is None


def test_a_group_size_that_does_not_divide_a_layer_names_it(tied):
    want = r"int4 group size 128 does not divide the 64 input columns of model\.layers\.0\.self_attn\.qkv_proj; " \
           r"group sizes that do: 32, 64"
    with pytest.raises(InvalidRequestError, match=want):
        _llm(tied, quantization="int4", quant_group_size=128)


def test_cli_flags_reach_the_engine_options():
    from ridgeline.cli import build_parser, engine_kwargs
    args = build_parser().parse_args(["generate", "hi", "--quantization", "int4", "--quant-group-size", "64",
                                      "--quant-symmetric"])
    kw = engine_kwargs(args)
    assert (kw["quantization"], kw["quant_group_size"], kw["quant_symmetric"]) == ("int4", 64, True)
    assert EngineConfig.from_kwargs("m", **kw).model.weight_format == "int4-sym-g64"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "hi", "--quant-group-size", "48"])


@pytest.fixture(scope="module")
def three_layers_llama(tmp_path_factory):
    """untied: the LM head has its own checkpoint tensor"""
    return make_tiny_model(tmp_path_factory.mktemp("q3"), "llama", num_hidden_layers=3)


def test_untied_head_loads_its_own_tensor_and_quantizes(three_layers_llama):
    llm = _llm(three_layers_llama, quantization="int4", quant_symmetric=True,
               layer_formats=[("lm_head", "int4-sym")])  # a rule asks for a 4-bit head
    head = llm.engine.runner.model.lm_head
    assert head.format.name == "int4-sym" and head.weight is None
    assert llm.info.weight_formats == "int4-sym x 13"  # 3 layers x 4, and the head
    assert llm.generate("hello", SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids


def test_without_the_kernels_each_layer_is_named_and_runs_as_modules(tied, monkeypatch):
    with_kernels = _logits(_llm(tied, quantization="int8"))
    monkeypatch.setattr(cpu_quant, "available", lambda kind: False)  # a CPU without AVX-512
    llm = _llm(tied, quantization="int8")
    assert all("int8 weights have no C kernel on this CPU" in p for p in llm.info.layer_paths)
    assert "layer 0: modules (model.layers.0.self_attn.qkv_proj: int8 weights have no C kernel" in llm.info.summary()
    got = _logits(llm)  # the torch reference path: fp32 x
    if cpu_quant.int8_rounds_activations():  # the kernel's bf16 dot products round x to bf16
        assert float((got - with_kernels).abs().max()) < 0.02 * float(with_kernels.abs().max())
    else:
        torch.testing.assert_close(got, with_kernels, atol=1e-4, rtol=1e-4)


def test_bench_decode_counts_the_quantized_bytes(tiny_llama, tmp_path):
    import json
    from ridgeline.cli import main
    out = tmp_path / "d.json"
    assert main(["bench", "decode", "--model", str(tiny_llama), "--dtype", "float32", "--kv-cache-memory", "4MiB",
                 "--quantization", "int8", "--prompt-len", "150", "--output-len", "4", "--repeats", "1",
                 "--baseline", "none", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["engine"]["quantization"] == "int8" and r["engine"]["weight_formats"] == "int8 x 9"
    assert r["engine"]["weight_bytes_per_token"] < r["engine"]["num_params"] * 1.05  # ~1 byte a weight, not 4


def test_a_tied_head_is_quantized_from_the_checkpoint_tensor_not_the_rounded_table(tied):
    """In a bf16 engine the embedding table is bf16; an int4 head still sees the fp32 checkpoint
    values (a Q4_1 file's grid comes back exactly only from those)."""
    from safetensors.torch import load_file
    from ridgeline.formats import rtn
    llm = LLM(str(tied), dtype="bfloat16", kv_cache_memory="4MiB", progress=False, quantization="int4",
              layer_formats=[("lm_head", "int4")])
    model = llm.engine.runner.model
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16 and model.lm_head.weight is None
    ckpt = load_file(str(tied / "model.safetensors"))["model.embed_tokens.weight"]
    want = rtn.quantize_int4(ckpt, 32, False)
    head = model.lm_head
    if head.packed is None:
        assert torch.equal(head.quant.q, want.q) and torch.equal(head.quant.scale, want.scale)
    else:
        ref = cpu_quant.PackedInt4(want)
        assert torch.equal(head.packed.data, ref.data) and torch.equal(head.packed.scale, ref.scale)
