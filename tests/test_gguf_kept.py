"""--quantization gguf: a GGUF file's blocks load as they are stored. Every block type converts to the
values gguf-py dequantizes (exactly where our format holds its grid, within a measured bound where it is
repacked); a model keeps its q/k row order right, runs in the C decoder stack equal to the module path,
and a Q4_1 file gives the logits int4 round-to-nearest gives on its dequantized weights, bit for bit."""
import itertools

import numpy as np
import pytest
import torch
from gguf import GGUFWriter, quants
from gguf import GGMLQuantizationType as T

from ridgeline import LLM
from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_quant
from ridgeline.gguf import repack as gguf_repack
from ridgeline.gguf.blocks import GGUFBlocks
from test_gguf import HEADS, HIDDEN, KV_HEADS, add_tiny_header, _add, _finish, llama_permute, random_blocks
from test_quant_engine import _generate, _logits

FFN = 512
CONVERSIONS = [(T.Q4_0, "int4-sym"), (T.Q4_0, "int4"), (T.Q4_1, "int4"), (T.Q8_0, "int8-g32"), (T.Q4_K, "int4"),
               (T.Q6_K, "int8-g32"), (T.Q4_1, "int8-g32"), (T.Q4_0, "int8-g32"), (T.Q4_K, "int8-g32"),
               (T.Q5_1, "int8-g32"), (T.Q5_K, "int8-g32"), (T.Q3_K, "int8-g32"), (T.Q2_K, "int8-g32"),
               (T.IQ4_NL, "int8-g32"), (T.IQ4_XS, "int8-g32"), (T.MXFP4, "mxfp4"), (T.MXFP4, "int8-g32"),
               (T.Q5_0, "int5-sym"), (T.Q5_0, "int5"), (T.Q5_1, "int5"), (T.Q5_K, "int5"), (T.Q4_0, "int5-sym"),
               (T.Q4_1, "int5"), (T.Q4_K, "int5"), (T.Q5_0, "int8-g32"), (T.Q6_K, "int6"),
               (T.IQ4_NL, "iq4-nl"), (T.IQ4_XS, "iq4-xs"), (T.Q3_K, "int3"), (T.Q2_K, "int2"),
               (T.Q4_K, "int4-k"), (T.Q5_K, "int5-k")]
NO_QUANTIZE = (T.Q4_K, T.Q6_K, T.Q5_K, T.Q3_K, T.Q2_K, T.IQ4_NL, T.IQ4_XS)  # gguf-py cannot quantize them


def _blocks(qtype, N, K, seed=0):
    rng = np.random.default_rng(seed)
    if qtype in NO_QUANTIZE:  # random valid blocks
        raw = random_blocks(qtype, N, K, rng)
    else:
        w = (rng.standard_normal((N, K)) * rng.uniform(0.01, 0.2, (N, 1))).astype(np.float32)
        raw = quants.quantize(w, qtype).reshape(N, -1)
    return GGUFBlocks(qtype, (N, K), torch.from_numpy(raw.copy()), "w"), quants.dequantize(raw, qtype).reshape(N, K)


@pytest.mark.parametrize("qtype,target", CONVERSIONS, ids=lambda v: getattr(v, "name", v))
def test_every_block_type_converts_to_the_values_gguf_dequantizes(qtype, target):
    b, want = _blocks(qtype, 40, 512)
    t, exact = gguf_repack.convert(b, target)
    got = t.dequantize().numpy()
    assert exact == ((target, qtype) in gguf_repack.EXACT)
    if exact:
        np.testing.assert_array_equal(got, want)
        return
    err = np.abs(got - want)
    if target in ("int4", "int5"):  # K-quants: q kept, the fp32 scale and minimum products rounded to fp16
        scale = t.scale.float().abs().repeat_interleave(32, 1).numpy()  # (2^-11 relative)
        mn = t.min.float().abs().repeat_interleave(32, 1).numpy()
        assert (err <= ((15 if target == "int4" else 31) * scale + mn) * 2**-11 + 1e-12).all()
    else:  # re-rounded to int8 with an fp16 scale per 32: half a step of the new grid (a scale in fp16's
        # subnormal range, rounded down, can clamp the largest value: 127 halves of its 2^-24 quantum more)
        step = t.scale.float().repeat_interleave(32, 1).numpy()
        assert (err <= step * (0.5 + 1e-3) + 127 * 2**-25).all()
    rel = float(np.sqrt((err ** 2).mean() / (want ** 2).mean()))
    print(f"{qtype.name} -> {target}: rms error / rms weight {rel:.2e}")
    assert rel < (1e-3 if target in ("int4", "int5") else 1e-2), rel  # int8 re-rounding: ~1/(127 * sqrt(12)) of the range


def test_each_layer_takes_the_narrowest_format_that_holds_its_types():
    pick = gguf_repack.target_for
    assert pick({T.Q4_0}) == "int4-sym" and pick({T.Q4_0, T.Q4_1}) == "int4" and pick({T.Q5_0}) == "int5-sym"
    assert pick({T.Q5_0, T.Q4_0}) == "int5-sym" and pick({T.Q5_1}) == pick({T.Q5_K, T.Q5_1}) == "int5"
    assert pick({T.Q5_K}) == "int5-k"  # its own grid alone: 5.625 bits a weight (the file 5.5)
    assert pick({T.Q5_0, T.Q4_K}) == pick({T.Q5_K, T.Q4_1}) == "int5"  # a minimum beside 5 bits: int5
    assert pick({T.Q5_K, T.Q6_K}) == pick({T.Q5_0, T.Q8_0}) == pick({T.Q6_K, T.Q4_K}) == "int8-g32"
    assert pick({T.Q6_K}) == "int6"  # its own grid alone: 6.5625 bits a weight, as stored
    assert pick({T.IQ4_NL}) == "iq4-nl" and pick({T.IQ4_XS}) == "iq4-xs"  # their tables and scales as stored
    assert pick({T.IQ4_NL, T.IQ4_XS}) == pick({T.IQ4_NL, T.Q4_0}) == "int8-g32"
    assert pick({T.Q3_K}) == "int3" and pick({T.Q2_K}) == "int2" and pick({T.Q3_K, T.Q2_K}) == "int8-g32"
    assert pick({T.Q4_K}) == "int4-k" and pick({T.Q4_K, T.Q4_0}) == "int4"  # its own grid alone, else int4's


def test_kept_grids_beside_another_type_pick_int8_and_the_rest_stay_refused():
    from ridgeline.errors import ModelLoadError
    from ridgeline.gguf.dequant import dequantize
    for qtype in (T.Q3_K, T.Q2_K, T.IQ4_NL, T.IQ4_XS):
        assert gguf_repack.target_for({qtype, T.Q4_K}) == "int8-g32"  # beside another type: the grid holding both
        with pytest.raises(ValueError, match="int4 form"):
            gguf_repack.convert(_blocks(qtype, 4, 256)[0], "int4")
    assert gguf_repack.target_for({T.MXFP4}) == "mxfp4"  # GPT-OSS's experts: the mxfp4 format's own blocks
    assert gguf_repack.target_for({T.MXFP4, T.Q8_0}) == "int8-g32"  # beside another type: a grid holding both
    for qtype in (T.IQ2_XS, T.IQ3_S, T.IQ1_S):
        assert gguf_repack.target_for({qtype}) is None
        size = __import__("gguf").GGML_QUANT_SIZES[qtype][1]
        with pytest.raises(ModelLoadError, match=f"GGML type {qtype.name}, which Ridgeline cannot dequantize"):
            dequantize(np.zeros(size * 4, np.uint8), qtype, (1, 4 * __import__("gguf").GGML_QUANT_SIZES[qtype][0]))


def test_rows_of_blocks_permute_as_whole_output_channels():
    b, want = _blocks(T.Q4_1, 64, 64)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    moved = b.permute_rows(lambda rows: rows[perm])
    np.testing.assert_array_equal(moved.dequantize().numpy(), want[perm.numpy()])


def write_gguf(path, types: dict, tied: bool, arch: str = "llama", layers: int = 2) -> None:
    """A tiny GGUF model; types: GGUF tensor kind (attn_q, ..., token_embd, output) -> GGML type (default Q4_1)."""
    rng = np.random.default_rng(7)
    w = GGUFWriter(str(path), arch)
    tokens = add_tiny_header(w, layers)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)

    _add(w, "token_embd.weight", mat(len(tokens), HIDDEN), types.get("token_embd", T.Q8_0), rng)
    if not tied:
        _add(w, "output.weight", mat(len(tokens), HIDDEN), types.get("output", T.Q8_0), rng)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    kv = KV_HEADS * HIDDEN // HEADS
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (kv, HIDDEN), "attn_v": (kv, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
              "ffn_down": (HIDDEN, FFN)}
    for i in range(layers):
        for name, shape in shapes.items():
            m = mat(*shape)
            if arch == "llama" and name in ("attn_q", "attn_k"):  # llama.cpp's layout of q/k rows
                m = llama_permute(m, HEADS if name == "attn_q" else KV_HEADS)
            _add(w, f"blk.{i}.{name}.weight", m, types.get(name, T.Q4_1), rng)
            if arch == "qwen2" and name in ("attn_q", "attn_k", "attn_v"):
                w.add_tensor(f"blk.{i}.{name}.bias", (0.1 * rng.standard_normal(shape[0])).astype(np.float32))
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    _finish(w)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))


def _llm(path, **kw):
    return LLM(str(path), dtype="float32", kv_cache_memory="4MiB", progress=False, **kw)


def _module_path_equals_the_stack(kept) -> None:
    """Greedy output through the module path (every layer) equals the C stack's, bit for bit."""
    out = _generate(kept)
    inner = kept.engine.runner.model.model
    segments, inner.segments = inner.segments, [(0, len(inner.layers), False)]
    try:
        assert _generate(kept) == out
    finally:
        inner.segments = segments


MIXED = {"attn_q": T.Q4_K, "attn_k": T.Q4_0, "attn_v": T.Q4_1, "attn_output": T.Q6_K, "ffn_gate": T.Q8_0,
         "ffn_up": T.Q4_0, "ffn_down": T.F16, "output": T.Q4_0}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mixed_file_keeps_its_blocks_and_stays_close_to_the_dequantized_model(tmp_path, home, arch):
    path = tmp_path / "mixed.gguf"
    write_gguf(path, MIXED, tied=False, arch=arch)
    ref, kept = _llm(path, quantization="none"), _llm(path)  # a .gguf model keeps its blocks by default
    assert (ref.info.quantization, kept.info.quantization) == ("none", "gguf")
    assert sorted(kept.info.weight_formats.split(", ")) == [  # down_proj is F16: dense in --dtype
        "Q4_0 kept (int4-sym) x 1", "Q4_K+Q4_0+Q4_1 kept (int4-k + int4-sym + int4) x 2",
        "Q6_K kept (int6) x 2", "Q8_0+Q4_0 kept (int8-g32 + int4-sym) x 2", "f32 x 2"]
    assert "quantization gguf" in kept.info.summary()
    want, got = _logits(ref), _logits(kept)
    rel = float((got - want).abs().max() / want.abs().max())
    assert rel < 0.02, rel  # q/k rows in the wrong order would scramble attention: far larger
    if cpu_quant.available("int4") and kept.info.kernel_plan.c_stack:
        assert all(p is None for p in kept.info.layer_paths)
    _module_path_equals_the_stack(kept)


K_MIX = {"attn_q": T.Q5_K, "attn_k": T.Q3_K, "attn_v": T.IQ4_XS, "attn_output": T.Q2_K, "ffn_gate": T.IQ4_NL,
         "ffn_up": T.Q5_1, "ffn_down": T.Q6_K, "output": T.Q5_K}


def test_a_file_of_the_other_common_types_loads_and_runs_in_the_c_stack(tmp_path, home):
    """Q3_K / IQ4_XS / IQ4_NL fused beside other types (each shard in its own grid), Q2_K and Q6_K alone in their
    own grids: close to the dequantized model, the C stack equal to the module path."""
    path = tmp_path / "kmix.gguf"
    write_gguf(path, K_MIX, tied=False)
    ref, kept = _llm(path, quantization="none"), _llm(path)
    formats = kept.info.weight_formats
    assert "Q5_K+Q3_K+IQ4_XS kept (int5-k + int3 + iq4-xs) x 2" in formats
    assert "IQ4_NL+Q5_1 kept (iq4-nl + int5) x 2" in formats
    assert "Q6_K kept (int6) x 2" in formats and "Q2_K kept (int2) x 2" in formats
    want, got = _logits(ref), _logits(kept)
    rel = float((got - want).abs().max() / want.abs().max())
    assert rel < 0.02, rel
    if cpu_quant.available("int8") and kept.info.kernel_plan.c_stack:
        assert all(p is None for p in kept.info.layer_paths)
    _module_path_equals_the_stack(kept)


@pytest.mark.parametrize("qtype,target,kind,overhead", [(T.Q6_K, "int6", "int6", 1.0), (T.IQ4_NL, "iq4-nl", "iq4", 1.0),
                                                         (T.IQ4_XS, "iq4-xs", "iq4", 4.3125 / 4.25),
                                                         (T.Q3_K, "int3", "kq", 3.5625 / 3.4375),
                                                         (T.Q2_K, "int2", "kq", 1.0),
                                                         (T.Q4_K, "int4-k", "int4", 4.625 / 4.5),
                                                         (T.Q5_K, "int5-k", "int5", 5.625 / 5.5)],
                         ids=lambda v: getattr(v, "name", v))
def test_the_kept_grid_kernels_multiply_the_files_values_and_a_row_never_depends_on_its_batch(qtype, target, kind,
                                                                                                overhead):
    if not cpu_quant.available(kind):
        pytest.skip(f"the {kind} kernel needs {cpu_quant.NEEDS[kind]}")
    b, want = _blocks(qtype, 100, 4096, seed=3)  # K over one k block at 200 rows: blocked k sums
    t, exact = gguf_repack.convert(b, target)
    assert exact and t.nbytes == pytest.approx(b.blocks().numel() * overhead)  # the file's bytes (IQ4_XS: its 6-bit scales in int8)
    packed = {"int6": cpu_quant.PackedInt6, "iq4-nl": cpu_quant.PackedIQ4, "iq4-xs": cpu_quant.PackedIQ4,
              "int3": cpu_quant.PackedKQ, "int2": cpu_quant.PackedKQ, "int4-k": cpu_quant.PackedKGrid,
              "int5-k": cpu_quant.PackedKGrid}[target](t)
    x = torch.randn(200, 4096, generator=torch.Generator().manual_seed(0))
    y = packed(x)
    ref = x.bfloat16().float() @ torch.from_numpy(want).T  # the kernel's bf16 x against the exact weights
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-5
    for rows in ((0, 1), (7, 10), (13, 17), (150, 200)):
        assert torch.equal(packed(x[rows[0]:rows[1]]), y[rows[0]:rows[1]]), rows


def _split_projection(shards, K, plan):
    """A fused Linear of GGUF shards [(qtype, rows)] under the kept-blocks split format: (it, dequantized W)."""
    from ridgeline.gguf.kept import KeptSplit
    from ridgeline.layers.linear import Linear
    lin = Linear(K, sum(n for _, n in shards), KeptSplit(plan), shard_sizes=[n for _, n in shards], prefix="qkv")
    want = []
    for i, (qtype, n) in enumerate(shards):
        b, w = _blocks(qtype, n, K, seed=i)
        lin.load("weight", b, i)
        want.append(torch.from_numpy(w))
    lin.finish_loading()
    return lin, torch.cat(want)


@pytest.mark.parametrize("shards", [[(T.Q4_K, 96), (T.Q4_K, 48), (T.Q6_K, 48)], [(T.Q5_K, 144), (T.Q5_K, 40),
                                                                                   (T.Q6_K, 40)],
                                    [(T.Q5_0, 56), (T.Q8_0, 8), (T.Q8_0, 8)], [(T.Q6_K, 48), (T.Q4_K, 8), (T.Q6_K, 8)]],
                         ids=lambda v: "+".join(f"{q.name}x{n}" for q, n in v))
def test_a_projection_of_mixed_types_keeps_each_shard_in_its_own_grid(shards):
    """q/k in Q4_K (or Q5_K) beside v in Q6_K, as Q4_K_M / Q5_K_M files mix them: every run of one type keeps its
    own grid (the file's bits within 1.15x, not int8-g32's 8.5), a column's value is its part's call alone, and
    the C table (WF_SPLIT) gives the module path's values bit for bit at one row and at many."""
    from gguf import GGML_QUANT_SIZES
    from ridgeline.kernels import cpu_stack
    from ridgeline.layers.kernel_plan import KernelPlan
    K = 512
    plan = KernelPlan(quant=frozenset(cpu_quant.KINDS))
    lin, want = _split_projection(shards, K, plan)
    runs = [(q, sum(n for _, n in run)) for q, run in itertools.groupby(shards, key=lambda s: s[0])]
    assert [part.out_features for _, part in lin.parts] == [n for _, n in runs]
    assert lin.format.label(lin).startswith("+".join(q.name for q, _ in runs) + " kept")
    # the file's bytes with each part's columns padded to the kernels' group of 48, as every packed format pads
    file_bytes = sum(-(-n // 48) * 48 * K // GGML_QUANT_SIZES[q][0] * GGML_QUANT_SIZES[q][1] for q, n in runs)
    assert lin.format.weight_bytes(lin) <= 1.15 * file_bytes
    x = torch.randn(7, K, generator=torch.Generator().manual_seed(1))
    y = lin(x)
    ref = torch.empty_like(y)  # each part's x as its kernel reads it (bf16, int8-g32's int16 blocks), the exact weights
    for row, part in lin.parts:
        kind = "int8-g32" if "int8-g32" in part.format.label(part) else "int4"
        n = slice(row, row + part.out_features)
        ref[:, n] = cpu_quant.activations_as_read(kind, x) @ want[n].T
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-5
    for row, part in lin.parts:
        assert torch.equal(y[:, row:row + part.out_features], part(x))
    w = lin.format.stack_weight(lin)
    if isinstance(w, str):
        pytest.skip(w)  # a CPU without the parts' kernels: the module path above is torch's
    desc = torch.tensor([*w, 0], dtype=torch.int64)
    for rows in (x[:1], x):
        out, ids = torch.empty(rows.shape[0], lin.out_features), torch.empty(rows.shape[0], dtype=torch.int64)
        cpu_stack.linear_argmax(desc, rows.contiguous(), out, ids)
        assert torch.equal(out, lin(rows)) and torch.equal(ids, out.argmax(-1))
    bad = torch.empty(1, lin.out_features + 8)  # columns the table does not add up to
    with pytest.raises(RuntimeError, match="failed"):
        cpu_stack.linear_argmax(desc, x[:1].contiguous(), bad, torch.empty(1, dtype=torch.int64))


GRID_FILES = {  # GGML types per tensor -> the weight formats they load as, and the kernel kind that runs them
    # Q5_0 / Q5_1 / Q5_K (the bulk of Q5_K_M files, and Q4_K_M files' fallback type): 5 bits a weight kept,
    # int5-sym for Q5_0, int5-k for Q5_K (a Q4_K shard beside a 5-bit one keeps its own int4-k)
    "five-bit": ({"attn_q": T.Q5_K, "attn_k": T.Q5_K, "attn_v": T.Q5_K, "attn_output": T.Q5_1, "ffn_gate": T.Q5_0,
                  "ffn_up": T.Q4_K, "ffn_down": T.Q5_0, "output": T.Q5_K},
                 ["Q5_0 kept (int5-sym) x 2", "Q5_0+Q4_K kept (int5-sym + int4-k) x 2", "Q5_1 kept (int5) x 2",
                  "Q5_K kept (int5-k) x 3"], "int5"),
    # IQ4_XS files (IQ4_NL where a row is not a multiple of 256): 4.3125 and 4.5 bits a weight
    "iq4": ({"attn_q": T.IQ4_XS, "attn_k": T.IQ4_XS, "attn_v": T.IQ4_XS, "attn_output": T.IQ4_NL,
             "ffn_gate": T.IQ4_XS, "ffn_up": T.IQ4_XS, "ffn_down": T.IQ4_NL, "output": T.IQ4_XS},
            ["IQ4_NL kept (iq4-nl) x 4", "IQ4_XS kept (iq4-xs) x 5"], "iq4"),
    # Q3_K_* and Q2_K files: 3.5625 and 2.625 bits a weight (the files 3.4375 and 2.625)
    "low-bit": ({"attn_q": T.Q3_K, "attn_k": T.Q3_K, "attn_v": T.Q3_K, "attn_output": T.Q3_K, "ffn_gate": T.Q2_K,
                 "ffn_up": T.Q2_K, "ffn_down": T.Q3_K, "output": T.Q2_K},
                ["Q2_K kept (int2) x 3", "Q3_K kept (int3) x 6"], "kq"),
    # Q4_K_M's mix: Q6_K alone keeps its 6.5625 bits (the LM head too), Q4_K alone its 4.625; beside each other
    # in a fused q/k/v each keeps its own (a split projection)
    "k-mix": ({"attn_output": T.Q6_K, "ffn_down": T.Q6_K, "output": T.Q6_K, "attn_q": T.Q4_K, "attn_k": T.Q4_K,
               "attn_v": T.Q6_K, "ffn_gate": T.Q4_K, "ffn_up": T.Q4_K},
              ["Q4_K kept (int4-k) x 2", "Q4_K+Q6_K kept (int4-k + int6) x 2", "Q6_K kept (int6) x 5"], "int6"),
}


@pytest.mark.parametrize("name", list(GRID_FILES))
def test_kept_grids_run_in_their_own_kernels_in_the_c_stack(tmp_path, home, monkeypatch, name):
    """Each file's blocks keep the file's values and scales in their own grid: close to the dequantized model,
    the C stack equal to the module path, and the torch path without the kernel close to both."""
    types, formats, kind = GRID_FILES[name]
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, types, tied=False)
    ref, kept = _llm(path, quantization="none"), _llm(path)
    assert sorted(kept.info.weight_formats.split(", ")) == formats
    want, got = _logits(ref), _logits(kept)
    rel = float((got - want).abs().max() / want.abs().max())
    assert rel < 0.02, rel
    if cpu_quant.available(kind) and kept.info.kernel_plan.c_stack:
        assert all(p is None for p in kept.info.layer_paths)
    _module_path_equals_the_stack(kept)
    monkeypatch.setattr(cpu_quant, "available", lambda kind: False)  # a CPU without AVX-512
    plain = _llm(path)
    assert all("weights have no C kernel on this CPU" in p for p in plain.info.layer_paths)
    torch_path = _logits(plain)
    assert float((torch_path - got).abs().max() / got.abs().max()) < 0.02


def test_a_q4_1_file_kept_equals_int4_rtn_of_its_dequantized_weights(tmp_path, home):
    """int4 asymmetric g32 round-to-nearest rebuilds every Q4_1 block from its values, and int8-g32 the
    Q8_0 head: the same packed bytes, the same kernels, the same logits."""
    path = tmp_path / "q41.gguf"
    write_gguf(path, {}, tied=True)
    kept = _llm(path, quantization="gguf")
    assert kept.info.weight_formats == "Q4_1 kept (int4) x 8, Q8_0 kept (int8-g32) x 1"
    rtn = _llm(path, quantization="int4", layer_formats=[("lm_head", "int8-g32")])
    assert torch.equal(_logits(kept), _logits(rtn))
    assert kept.info.weight_bytes == rtn.info.weight_bytes


def test_layer_rules_win_and_dequantize_the_blocks(tmp_path, home):
    path = tmp_path / "q41.gguf"
    write_gguf(path, {}, tied=True)
    llm = _llm(path, layer_formats=[("model.layers.0.*", "f32")])
    assert sorted(llm.info.weight_formats.split(", ")) == ["Q4_1 kept (int4) x 4", "Q8_0 kept (int8-g32) x 1",
                                                           "f32 x 4"]
    mixed = tmp_path / "k-mix.gguf"  # a rule naming one grid for a projection of mixed types: re-rounded into it
    write_gguf(mixed, GRID_FILES["k-mix"][0], tied=False)
    one_grid = _llm(mixed, layer_formats=[("*.qkv_proj", "gguf-int8-g32")])
    assert "Q4_K+Q6_K repacked (int8-g32) x 2" in one_grid.info.weight_formats
    assert one_grid.info.weight_bytes > _llm(mixed).info.weight_bytes
    split_all = _llm(mixed, layer_formats=[("*", "gguf-split")])  # a whole weight under the split format: one part
    assert "Q6_K kept (int6) x 5" in split_all.info.weight_formats
    assert torch.equal(_logits(split_all), _logits(_llm(mixed)))


@pytest.mark.parametrize("quantization", ["gguf", "gguf-a8"])
def test_gguf_needs_a_gguf_model_and_takes_no_int4_options(tiny_llama, quantization):
    with pytest.raises(InvalidRequestError, match=f"quantization {quantization} keeps a GGUF file's blocks, and this "
                                                  "model is not a .gguf file"):
        _llm(tiny_llama, quantization=quantization)
    with pytest.raises(InvalidRequestError, match="quant_symmetric needs a quantization"):
        _llm(tiny_llama, quantization=quantization, quant_symmetric=True)
    with pytest.raises(InvalidRequestError, match="applies to int4 and w4a8 only"):
        _llm(tiny_llama, quantization=quantization, quant_group_size=64)
    assert _llm(tiny_llama).info.quantization == "none"  # auto: an HF folder stays as loaded


def test_without_the_kernels_kept_blocks_run_in_torch(tmp_path, home, monkeypatch):
    path = tmp_path / "q41.gguf"
    write_gguf(path, {}, tied=True)
    with_kernels = _logits(_llm(path))
    monkeypatch.setattr(cpu_quant, "available", lambda kind: False)  # a CPU without AVX-512
    llm = _llm(path)
    assert all("gguf-int4 weights have no C kernel on this CPU" in p for p in llm.info.layer_paths)
    torch.testing.assert_close(_logits(llm), with_kernels, atol=2e-2, rtol=2e-2)  # the int4 kernel rounds x to bf16


@pytest.mark.slow  # starts rank processes
def test_a_split_projection_under_tensor_parallelism_matches_one_process(tmp_path, home):
    """Each rank holds its heads' rows of q/k (Q4_K) and v (Q6_K): its own split projection, the logits one
    process gives (o_proj / down_proj in 32-wide blocks, so their halves of K stay whole blocks)."""
    from test_tensor_parallel import BOUND
    path = tmp_path / "k-mix-tp.gguf"
    write_gguf(path, {**GRID_FILES["k-mix"][0], "attn_output": T.Q8_0, "ffn_down": T.Q5_0}, tied=False)
    kw = dict(dtype="float32", kv_cache_memory=8 << 20, progress=False)
    ref, tp = LLM(str(path), **kw), LLM(str(path), tensor_parallel_size=2, **kw)
    try:
        assert "Q4_K+Q6_K kept (int4-k + int6) x 2" in tp.info.weight_formats
        for prompt in ("hello world the", "a b c d e f"):
            want, got = ref.engine.prompt_logits(prompt), tp.engine.prompt_logits(prompt)
            # the row-parallel sums in another order, against logits up to ~13: BOUND relative to the largest
            assert got.shape == want.shape and ((got - want).abs().max() / want.abs().max()).item() < BOUND
    finally:
        tp.engine.close()
