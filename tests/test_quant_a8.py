"""W8A8 and W4A8 (kernels/gemm_a8.c): each equals quantize-the-activations, dequantize-the-weights,
then matmul; a row's result never depends on how many rows share the call; the formats run in the C
decoder stack and match the module path; the activation format belongs to the weight format."""
import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.config import EngineConfig
from ridgeline.kernels import cpu_quant
from ridgeline.formats import rtn
from conftest import make_tiny_model

pytestmark = pytest.mark.skipif(not cpu_quant.available("w8a8"), reason="no AVX512-VNNI kernels on this CPU")
# max |logit - float logit| / max |float logit| and the share of rows whose top token agrees, on the tiny
# random model (weights as int8 / int4, BOUNDS of test_quant_engine.py, plus what int8 activations add)
BOUNDS = {"w8a8": (0.05, 0.9), "w4a8": (0.35, 0.8)}
CASES = [("w8a8", None, False), ("w8a8-g32", None, False), ("w4a8", 32, False), ("w4a8", 32, True), ("w4a8", 64, False), ("w4a8", 128, True)]


def _w(N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, K, generator=g) * 0.05 + 0.01 * torch.randn(N, 1, generator=g)


def _packed(kind, w, group, sym):
    """(packed weight, dequantized weight, activation block)"""
    if kind == "w8a8":
        t = rtn.quantize_int8(w)
        return cpu_quant.PackedW8A8(t), t.dequantize(), rtn.A8_BLOCK
    if kind == "w8a8-g32":
        t = rtn.quantize_int8_g32(w)
        return cpu_quant.PackedW8A8G32(t), t.dequantize(), rtn.A8_BLOCK
    t = rtn.quantize_int4(w, group, sym)
    return cpu_quant.PackedW4A8(t), t.dequantize(), group


def _x(M, K, seed=1):
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed))
    x[:, 3] *= 20  # an outlier channel, as normed activations have
    if M > 2:
        x[2] = 0  # an all-zero row: scale 0
    return x


@pytest.mark.parametrize("kind,group,sym", CASES)
@pytest.mark.parametrize("M", [1, 3, 8, 9, 70])
@pytest.mark.parametrize("N,K", [(96, 256), (37, 128), (5, 384), (200, 1536)])
def test_kernel_equals_quantized_activations_times_dequantized_weights(kind, group, sym, M, N, K):
    w, x = _w(N, K, seed=M + N), _x(M, K)
    p, wd, block = _packed(kind, w, group, sym)
    got = p(x)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    xq = rtn.fake_quantize_rows(x, block).double()
    want = xq @ wd.double().T
    scale = (xq.abs() @ wd.abs().double().T).clamp_min(1e-3)  # sum of |terms|: the rounding scale
    assert float(((got.double() - want).abs() / scale).max()) < 2e-6
    if M > 2:
        assert torch.equal(got[2], torch.zeros(N))


@pytest.mark.parametrize("K", [36, 4, 100])
def test_w8a8_takes_any_multiple_of_four_columns(K):
    """blocks of 32 and a shorter last one; each block has its own activation scale"""
    w, x = _w(50, K), _x(4, K)
    x[1, -1] = 300.0  # an outlier in the last block only: the blocks before keep their resolution
    p, wd, _ = _packed("w8a8", w, None, False)
    xq = rtn.fake_quantize_rows(x, 32)
    if K > 32:
        assert float((xq[1, :32] - x[1, :32]).abs().max()) < float(x[1, :32].abs().max()) / 200
    want = xq.double() @ wd.double().T
    torch.testing.assert_close(p(x).double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of 4"):
        cpu_quant.PackedW8A8(rtn.quantize_int8(torch.randn(8, 30)))


@pytest.mark.parametrize("kind,group,sym", CASES)
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_do_not_depend_on_how_many_share_the_call(kind, group, sym, threads):
    p, _, _ = _packed(kind, _w(150, 1536), group, sym)  # 150: an odd number of column groups (4)
    x = _x(600, 1536)  # more rows than one chunk of quantized x
    full = p(x, threads)
    for m in (1, 2, 5, 8, 9, 33):
        assert torch.equal(p(x[:m], threads), full[:m]), m
    assert torch.equal(p(x[151:152], threads), full[151:152])
    assert torch.equal(p(x[7:12], 3 - threads), full[7:12])
    assert torch.equal(p(x[590:600]), full[590:600])


def test_the_activation_format_is_part_of_the_weight_format():
    cfg = EngineConfig.from_kwargs("m", quantization="w4a8", quant_group_size=64, quant_symmetric=True).model
    assert cfg.weight_format == "w4a8-sym-g64" and cfg.format_rules == (("lm_head", "w8a8-g32"),)
    assert EngineConfig.from_kwargs("m", quantization="w8a8").model.format_rules == ()


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("a8tied"), "qwen2")


def _llm(folder, **kw):
    return LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False, **kw)


def _generate(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    prompts = ["Once upon a time", "x", "abcdefghijklmnopqrstuvwxyz" * 2]
    return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for o in llm.generate(prompts, params, use_tqdm=False)
            for c in o.outputs]


@pytest.mark.parametrize("quantization,group,sym", [("w8a8", None, False), ("w4a8", None, False),
                                                    ("w4a8", 64, True)])
def test_a8_formats_run_in_the_stack_and_equal_the_module_path(tied, quantization, group, sym):
    llm = _llm(tied, quantization=quantization, quant_group_size=group, quant_symmetric=sym)
    model = llm.engine.runner.model
    assert model.model.layers[0].mlp.down_proj.format.name == llm.config.model.weight_format
    if llm.info.kernel_plan.c_stack:
        assert llm.info.layer_paths == (None, None)
    got = _generate(llm)
    inner = model.model
    segments, inner.segments = inner.segments, [(0, len(inner.layers), False)]
    try:
        assert _generate(llm) == got
    finally:
        inner.segments = segments
    ids = list(range(40, 100))
    logits, ref = llm.engine.prompt_logits(ids), _llm(tied).engine.prompt_logits(ids)
    rel = float((logits - ref).abs().max() / ref.abs().max())
    top = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
    assert 0 < rel < BOUNDS[quantization][0] and top >= BOUNDS[quantization][1], (rel, top)


def test_torch_path_rounds_activations_like_the_kernel(tied, monkeypatch):
    with_kernels = _llm(tied, quantization="w4a8")
    want = with_kernels.engine.prompt_logits(list(range(40, 90)))
    monkeypatch.setattr(cpu_quant, "available", lambda kind: False)
    llm = _llm(tied, quantization="w4a8")
    assert all("w4a8 weights have no C kernel on this CPU (it needs AVX-512 with AVX512-VNNI)" in p
               for p in llm.info.layer_paths)
    got = llm.engine.prompt_logits(list(range(40, 90)))
    assert float((got - want).abs().max()) < 0.02 * float(want.abs().max())  # fp32 sums vs exact integer ones


def test_w8a8_g32_names_itself_for_a_layer_it_cannot_take():
    from ridgeline.errors import InvalidRequestError
    from ridgeline.layers.kernel_plan import choose_kernels
    from ridgeline.layers.linear import Linear
    from ridgeline.layers.weight_formats import create_weight_format
    plan = choose_kernels(torch.device("cpu"), torch.float32, torch.float32)
    with pytest.raises(InvalidRequestError, match="w8a8-g32 needs input columns in multiples of 32; x.proj has 48"):
        Linear(48, 16, create_weight_format("w8a8-g32", plan), bias=False, prefix="x.proj")
