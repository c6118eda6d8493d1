"""--quantization fp8 / mxfp8 / mxfp4 / nvfp4 through the engine: a tiny random model's logits stay within
a per-format bound of the float model's, every layer runs in the C decoder stack and equals the module
path bit for bit, the LM head takes an 8-bit format, and a layer whose K is not whole blocks is a clear
error naming the formats that fit."""
import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.config import EngineConfig
from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_quant
from conftest import make_tiny_model

# max |logit - float logit| / max |float logit| over 60 rows of the tiny random model, and the share of
# rows whose top token agrees (measured: fp8 0.038 / 1.0, mxfp8 0.043 / 0.97, mxfp4 0.18 / 0.97,
# nvfp4 0.16 / 0.95: 4 bits on Gaussian weights, as int4)
BOUNDS = {"fp8": (0.08, 0.9), "mxfp8": (0.08, 0.9), "mxfp4": (0.35, 0.8), "nvfp4": (0.35, 0.8)}
HEADS = {"fp8": "fp8", "mxfp8": "mxfp8", "mxfp4": "mxfp8", "nvfp4": "fp8"}
IDS = list(range(40, 100))


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("fptied"), "qwen2")


def _llm(folder, **kw):
    return LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False, **kw)


@pytest.fixture(scope="module")
def float_logits(tied):
    return _llm(tied).engine.prompt_logits(IDS)


def _generate(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    prompts = ["Once upon a time", "x", "abcdefghijklmnopqrstuvwxyz" * 2]
    return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for o in llm.generate(prompts, params, use_tqdm=False)
            for c in o.outputs]


@pytest.mark.parametrize("quantization", ["fp8", "mxfp8", "mxfp4", "nvfp4"])
def test_close_to_float_in_the_stack_and_equal_to_the_module_path(tied, float_logits, quantization):
    llm = _llm(tied, quantization=quantization)
    model = llm.engine.runner.model
    assert model.model.layers[0].mlp.down_proj.format.name == quantization
    assert model.lm_head.format.name == HEADS[quantization]
    kind = "fp4" if quantization in ("mxfp4", "nvfp4") else "fp8"
    if cpu_quant.available(kind) and llm.info.kernel_plan.c_stack:
        assert llm.info.layer_paths == (None, None)  # never the module fallback
    logits = llm.engine.prompt_logits(IDS)
    rel = float((logits - float_logits).abs().max() / float_logits.abs().max())
    top = float((logits.argmax(-1) == float_logits.argmax(-1)).float().mean())
    assert 0 < rel < BOUNDS[quantization][0] and top >= BOUNDS[quantization][1], (rel, top)
    got = _generate(llm)
    inner = model.model
    segments, inner.segments = inner.segments, [(0, len(inner.layers), False)]
    try:
        assert _generate(llm) == got
    finally:
        inner.segments = segments


@pytest.mark.parametrize("name", ["fp8-e5m2", "fp8-tensor", "fp8-e5m2-tensor"])
def test_fp8_variants_are_registered_formats(tied, float_logits, name):
    llm = _llm(tied, layer_formats=[("*", name)])
    assert llm.info.weight_formats == f"{name} x 9"
    logits = llm.engine.prompt_logits(IDS)
    assert float((logits - float_logits).abs().max() / float_logits.abs().max()) < 0.15


def test_fp4_activations_on_the_torch_path_round_like_the_kernel(tied, monkeypatch):
    want = _llm(tied, quantization="nvfp4").engine.prompt_logits(IDS)
    monkeypatch.setattr(cpu_quant, "available", lambda kind: False)
    llm = _llm(tied, quantization="nvfp4")
    assert all("nvfp4 weights have no C kernel on this CPU (it needs AVX-512 with AVX512-VNNI)" in p
               for p in llm.info.layer_paths)
    got = llm.engine.prompt_logits(IDS)
    assert float((got - want).abs().max()) < 0.02 * float(want.abs().max())


def test_k_not_in_whole_blocks_names_the_layer_and_what_fits(tmp_path):
    folder = make_tiny_model(tmp_path, "llama", hidden_size=48, intermediate_size=96)
    want = (r"mxfp4 needs the input columns in whole blocks of 32; model\.layers\.0\.self_attn\.qkv_proj has 48\. "
            r"Formats that take 48 columns: fp8, fp8-e5m2, int8, nvfp4")
    with pytest.raises(InvalidRequestError, match=want):
        _llm(folder, quantization="mxfp4")
    assert _llm(folder, quantization="nvfp4").info.weight_formats.startswith("nvfp4 x 8")


def test_options_and_cli():
    from ridgeline.cli import build_parser, engine_kwargs
    kw = engine_kwargs(build_parser().parse_args(["generate", "hi", "--quantization", "nvfp4"]))
    cfg = EngineConfig.from_kwargs("m", **kw).model
    assert cfg.weight_format == "nvfp4" and cfg.format_rules == (("lm_head", "fp8"),)
    assert EngineConfig.from_kwargs("m", quantization="mxfp4").model.format_rules == (("lm_head", "mxfp8"),)
    assert EngineConfig.from_kwargs("m", quantization="fp8").model.format_rules == ()
    with pytest.raises(InvalidRequestError, match="applies to int4 and w4a8 only"):
        EngineConfig.from_kwargs("m", quantization="mxfp4", quant_group_size=32)
    with pytest.raises(InvalidRequestError, match="quant_symmetric applies to int4 and w4a8 only \\(nvfp4 is"):
        EngineConfig.from_kwargs("m", quantization="nvfp4", quant_symmetric=True)


def test_eval_sweep_names_the_quantizations_it_takes():
    from ridgeline.eval.sweep import sweep_settings
    with pytest.raises(InvalidRequestError, match="--sweep takes --quantization none, auto, int8, w8a8, int4, w4a8, gguf; got mxfp4"):
        sweep_settings({"quantization": "mxfp4"})
