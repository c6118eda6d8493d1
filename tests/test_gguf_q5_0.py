"""GGUF Q5_0 (llama.cpp's blocks of 32: an fp16 scale d, 32 high bits, 16 bytes of low nibbles; w = d (q - 16)),
quantized here by llama.cpp's reference quantize_row_q5_0: it dequantizes to the reference values exactly,
its blocks are kept as int5-sym exactly (q and d as stored; as int8-g32 too, q - 16 an int8, beside 8-bit
shards) and run in the C stack, a model kept greedy-decodes as the same model dequantized, and the dequantized model's logits are
transformers' on the same file."""
import numpy as np
import pytest
import torch
from gguf import GGUFWriter, quants
from gguf import GGMLQuantizationType as T

from ridgeline import LLM
from ridgeline.gguf import repack
from ridgeline.gguf.blocks import GGUFBlocks
from ridgeline.gguf.convert import ensure_converted, hf_name
from ridgeline.gguf.dequant import dequantize
from ridgeline.kernels import cpu_quant
from test_gguf import HEADS, HIDDEN, KV_HEADS, add_tiny_header, _finish, llama_permute
from test_quant_engine import PROMPT_IDS, _generate, _logits

FFN, LAYERS = 512, 2


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_row_q5_0_ref: [rows, cols] float32 -> [rows, cols / 32 * 22] block bytes."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    first = np.abs(blocks).argmax(axis=1)  # `if (amax < fabsf(v))`: the first of the largest |v|
    d = blocks[np.arange(len(blocks)), first] / np.float32(-16)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    # MIN(31, (int8_t)(x * id + 16.5f)): the cast truncates
    q = np.minimum(31, np.trunc(blocks * inv[:, None] + np.float32(16.5)).astype(np.int8)).astype(np.uint8)
    qs = (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)
    qh = ((q >> 4).astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    out = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(-1, 2),
                          qh.astype("<u4").view(np.uint8).reshape(-1, 4), qs], axis=1)
    return out.reshape(x.shape[0], -1)


def dequantize_q5_0(raw: np.ndarray) -> np.ndarray:
    """llama.cpp's dequantize_row_q5_0: block bytes -> float32 [rows, cols]."""
    b = raw.reshape(-1, 22)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    qh, qs, j = b[:, 2:6].copy().view("<u4"), b[:, 6:].astype(np.uint32), np.arange(16, dtype=np.uint32)
    x0 = ((qs & 0x0F) | (((qh >> j) << 4) & 0x10)).astype(np.int32) - 16
    x1 = ((qs >> 4) | ((qh >> (j + 12)) & 0x10)).astype(np.int32) - 16
    return np.concatenate([x0.astype(np.float32) * d, x1.astype(np.float32) * d], axis=1).reshape(raw.shape[0], -1)


def _weights(rows, cols, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 0.2, (rows, 1))).astype(np.float32)
    w[0, :32] = 0  # a block of zeros: d = 0
    w[1, :32] = 0.5  # ties: every element is the largest
    w[1, 32:64] = np.linspace(-1, 1, 32, dtype=np.float32)  # + max rounds to 32, clamped to 31
    return w


def test_the_reference_quantizer_is_gguf_pys_and_dequantizes_to_the_reference_values():
    w = _weights(48, 512, 0)
    raw = quantize_q5_0(w)
    np.testing.assert_array_equal(raw, quants.quantize(w, T.Q5_0))  # two readings of llama.cpp's code agree
    want = dequantize_q5_0(raw)
    np.testing.assert_array_equal(dequantize(raw, T.Q5_0, w.shape).numpy(), want)
    np.testing.assert_array_equal(want, quants.dequantize(raw, T.Q5_0))
    d = np.abs(raw.reshape(-1, 22)[:, :2].copy().view(np.float16).astype(np.float32))  # per block of 32
    assert (np.abs(want - w).reshape(-1, 32) <= d * 1.001 + 1e-7).all()  # within a step (the clamp at 31)
    assert np.abs(want - w).max() > 0  # and not trivially exact


def test_blocks_are_kept_as_int5_sym_exactly():
    w = _weights(40, 256, 1)
    raw = quantize_q5_0(w)
    blocks = GGUFBlocks(T.Q5_0, w.shape, torch.from_numpy(raw.copy()), "w")
    t, exact = repack.convert(blocks, "int5-sym")
    assert exact and t.symmetric and int(t.q.max()) <= 31 and t.q.dtype == torch.uint8
    scale_bits = raw.reshape(-1, 22)[:, :2].copy().view(np.float16).reshape(40, -1)
    np.testing.assert_array_equal(t.scale.numpy().view(np.uint16), scale_bits.view(np.uint16))
    np.testing.assert_array_equal(t.dequantize().numpy(), dequantize_q5_0(raw))
    assert repack.target_for({T.Q5_0}) == "int5-sym" and repack.target_for({T.Q5_0, T.Q4_0, T.Q4_K}) == "int5"
    with pytest.raises(ValueError, match="Q5_0 has no int4 form"):
        repack.convert(blocks, "int4")


def test_blocks_are_kept_as_int8_g32_exactly_beside_8_bit_shards():
    w = _weights(40, 256, 1)
    raw = quantize_q5_0(w)
    blocks = GGUFBlocks(T.Q5_0, w.shape, torch.from_numpy(raw.copy()), "w")
    t, exact = repack.convert(blocks, "int8-g32")
    assert exact and ("int8-g32", T.Q5_0) in repack.EXACT
    assert int(t.q.min()) >= -16 and int(t.q.max()) <= 15 and t.q.dtype == torch.int8
    scale_bits = raw.reshape(-1, 22)[:, :2].copy().view(np.float16).reshape(40, -1)
    np.testing.assert_array_equal(t.scale.numpy().view(np.uint16), scale_bits.view(np.uint16))
    np.testing.assert_array_equal(t.dequantize().numpy(), dequantize_q5_0(raw))
    assert repack.target_for({T.Q5_0, T.Q8_0}) == "int8-g32"


def write_q5_0_model(path) -> dict[str, np.ndarray]:
    """A tiny tied llama whose every matrix is Q5_0; returns HF name -> the reference dequantized weight."""
    rng = np.random.default_rng(5)
    w = GGUFWriter(str(path), "llama")
    tokens = add_tiny_header(w, LAYERS)
    want = {}

    def q5(name, m, heads=None):
        raw = quantize_q5_0(m)
        want[hf_name(name)] = dequantize_q5_0(raw)  # rows of blocks: the rotary permutation moves whole rows
        w.add_tensor(name, quantize_q5_0(llama_permute(m, heads)) if heads else raw, raw_dtype=T.Q5_0)

    q5("token_embd.weight", (rng.standard_normal((len(tokens), HIDDEN)) * 0.05).astype(np.float32))
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    kv = KV_HEADS * HIDDEN // HEADS
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (kv, HIDDEN), "attn_v": (kv, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
              "ffn_down": (HIDDEN, FFN)}
    for i in range(LAYERS):
        for name, shape in shapes.items():
            heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(name)
            q5(f"blk.{i}.{name}.weight", (rng.standard_normal(shape) * 0.05).astype(np.float32), heads)
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    _finish(w)
    return want


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))


def _llm(path, **kw):
    return LLM(str(path), dtype="float32", kv_cache_memory="4MiB", progress=False, **kw)


def test_a_q5_0_model_loads_dequantized_and_kept_and_decodes_the_same(tmp_path, home):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    path = tmp_path / "q5.gguf"
    want = write_q5_0_model(path)
    state = load_file(ensure_converted(path, progress=False, weights=True) / "model.safetensors")
    for name, w in want.items():  # --quantization none loads these: the reference values, bit for bit
        assert torch.equal(state[name], torch.from_numpy(w)), name

    ref, kept = _llm(path, quantization="none"), _llm(path)  # a .gguf model keeps its blocks by default
    assert kept.info.quantization == "gguf" and kept.info.weight_formats == "Q5_0 kept (int5-sym) x 9"
    if cpu_quant.available("int5") and kept.info.kernel_plan.c_stack:
        assert all(p is None for p in kept.info.layer_paths)  # every layer in the C decoder stack
    assert [t for t, _ in _generate(kept)] == [t for t, _ in _generate(ref)]
    want_logits, got = _logits(ref), _logits(kept)
    rel = float((got - want_logits).abs().max() / want_logits.abs().max())
    assert rel < 0.02, rel  # the same weights; the int5 kernel rounds x to bf16 (0.006)
    assert float((got.argmax(-1) == want_logits.argmax(-1)).float().mean()) >= 0.95  # 68 of the 69 rows here

    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        hf_logits = torch.cat([hf(torch.tensor([ids])).logits[0] for ids in PROMPT_IDS])
    torch.testing.assert_close(want_logits, hf_logits, atol=1e-5 * float(hf_logits.abs().max()), rtol=0)  # 1.2e-6
