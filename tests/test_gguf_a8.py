"""--quantization gguf-a8: a GGUF file's blocks against int8 activations. Each type takes the a8 format that holds
it (Q4_0 / Q4_1 as stored and Q4_K on w4a8's kernel, the rest on w8a8-g32's, MXFP4 on its own), a fused projection
of mixed formats is split, every layer runs in the C stack equal to the module path, a row's result never
depends on its batch, and a Q4_1 file gives what --quantization w4a8 gives on its dequantized weights, bit for bit
(its bad input: test_gguf_kept.py's, parametrized over both)."""
import pytest
import torch
from gguf import GGMLQuantizationType as T

from ridgeline import LLM
from ridgeline.gguf.kept import KeptSplitA8, a8_target_for
from ridgeline.kernels import cpu_quant, cpu_stack
from ridgeline.layers.kernel_plan import KernelPlan
from test_gguf_kept import GRID_FILES, MIXED, _blocks, _llm, _logits, _module_path_equals_the_stack, write_gguf

pytestmark = pytest.mark.usefixtures("home")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))


def test_each_type_takes_the_a8_format_that_holds_it():
    assert a8_target_for(T.Q4_0) == "w4a8-sym"
    assert a8_target_for(T.Q4_1) == a8_target_for(T.Q4_K) == "w4a8"
    for qtype in (T.Q8_0, T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K, T.Q3_K, T.Q2_K, T.IQ4_NL, T.IQ4_XS):
        assert a8_target_for(qtype) == "w8a8-g32", qtype
    assert a8_target_for(T.MXFP4) == "mxfp4"  # its kernel quantizes the input to int8 already


def test_a_q4_1_file_equals_w4a8_on_its_dequantized_weights(tmp_path):
    """Q4_1 blocks as stored on w4a8's kernel, the Q8_0 head on w8a8-g32's: the packed bytes --quantization
    w4a8 makes from the dequantized weights (its head w8a8-g32 too), so the same logits bit for bit."""
    path = tmp_path / "q41.gguf"
    write_gguf(path, {}, tied=True)
    a8 = _llm(path, quantization="gguf-a8")
    assert a8.info.quantization == "gguf-a8"
    assert a8.info.weight_formats == "Q4_1 kept (w4a8) x 8, Q8_0 kept (w8a8-g32) x 1"
    assert "quantization gguf-a8" in a8.info.summary()
    rtn = _llm(path, quantization="w4a8")
    assert torch.equal(_logits(a8), _logits(rtn))
    assert a8.info.weight_bytes == rtn.info.weight_bytes == _llm(path).info.weight_bytes  # the file's grid


@pytest.mark.parametrize("name", ["mixed", "k-mix", "five-bit"])
def test_mixed_files_run_in_the_c_stack_near_the_dequantized_model(tmp_path, name):
    types = MIXED if name == "mixed" else GRID_FILES[name][0]
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, types, tied=False)
    ref, a8, w4a8 = _llm(path, quantization="none"), _llm(path, quantization="gguf-a8"), _llm(path, quantization="w4a8")
    formats = a8.info.weight_formats
    assert "w8a8-g32" in formats or "w4a8" in formats
    want = _logits(ref)
    rel = float((_logits(a8) - want).abs().max() / want.abs().max())
    rel_w4a8 = float((_logits(w4a8) - want).abs().max() / want.abs().max())
    # int8 activations cost the same on both: the blocks kept (or re-rounded to 8 bits) add little to it
    assert rel < 0.1 and rel < 1.5 * rel_w4a8 + 0.01, (rel, rel_w4a8)
    if cpu_quant.available("w4a8") and a8.info.kernel_plan.c_stack:
        assert all(p is None for p in a8.info.layer_paths)
    _module_path_equals_the_stack(a8)


def test_k_quant_mix_names_its_formats(tmp_path):
    path = tmp_path / "k-mix.gguf"
    write_gguf(path, GRID_FILES["k-mix"][0], tied=False)
    assert sorted(_llm(path, quantization="gguf-a8").info.weight_formats.split(", ")) == [
        "Q4_K repacked (w4a8) x 2", "Q4_K+Q6_K repacked (w4a8 + w8a8-g32) x 2", "Q6_K repacked (w8a8-g32) x 5"]


def test_a_split_a8_projection_never_depends_on_its_batch():
    """q/k in Q4_K on w4a8 beside v in Q6_K on w8a8-g32: each row quantized alone, so a row alone gives the bits
    it gives in a batch, in the module path and through the C table alike."""
    from ridgeline.layers.linear import Linear
    K, shards = 512, [(T.Q4_K, 96), (T.Q4_K, 48), (T.Q6_K, 48)]
    plan = KernelPlan(quant=frozenset(cpu_quant.KINDS))
    lin = Linear(K, 192, KeptSplitA8(plan), shard_sizes=[n for _, n in shards], prefix="qkv")
    for i, (qtype, n) in enumerate(shards):
        lin.load("weight", _blocks(qtype, n, K, seed=i)[0], i)
    lin.finish_loading()
    assert [part.format.target for _, part in lin.parts] == ["w4a8", "w8a8-g32"]
    x = torch.randn(9, K, generator=torch.Generator().manual_seed(2))
    y = lin(x)
    for r in (0, 4, 8):
        assert torch.equal(lin(x[r:r + 1]), y[r:r + 1])
    w = lin.format.stack_weight(lin)
    if isinstance(w, str):
        pytest.skip(w)
    desc = torch.tensor([*w, 0], dtype=torch.int64)
    out, ids = torch.empty(9, 192), torch.empty(9, dtype=torch.int64)
    cpu_stack.linear_argmax(desc, x, out, ids)
    assert torch.equal(out, y)


def test_without_the_kernels_gguf_a8_runs_in_torch_near_the_kernels(tmp_path, monkeypatch):
    path = tmp_path / "k-mix.gguf"
    write_gguf(path, GRID_FILES["k-mix"][0], tied=False)
    with_kernels = _logits(_llm(path, quantization="gguf-a8"))
    monkeypatch.setattr(cpu_quant, "available", lambda kind: False)  # a CPU without AVX-512
    llm = _llm(path, quantization="gguf-a8")
    assert all("weights have no C kernel on this CPU" in p for p in llm.info.layer_paths)
    got = _logits(llm)
    assert float((got - with_kernels).abs().max() / with_kernels.abs().max()) < 0.02


def test_llm_accepts_gguf_a8_by_name(tmp_path):
    path = tmp_path / "q41.gguf"
    write_gguf(path, {}, tied=True)
    out = LLM(str(path), quantization="gguf-a8", dtype="float32", kv_cache_memory="4MiB", progress=False).generate(
        ["hello"], use_tqdm=False)
    assert out and out[0].outputs[0].token_ids
