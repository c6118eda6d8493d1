"""GPTQ / AWQ folders: `ridgeline quantize` -> load is exact (the engine's int4 values are the ones
written), folders written here by hand in the hub's documented layouts load to the values the layout
defines (act-order g_idx included), and bad input is a clear error listing what is allowed."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ridgeline import LLM
from ridgeline.cli import main
from ridgeline.errors import InvalidRequestError, ModelLoadError
from ridgeline.layers.rotary import interleave_rows
from ridgeline.formats import grid, hub_layout
from ridgeline.quant.quantize import QuantizeOptions, quantize_folder
from conftest import make_tiny_model
from quant_helpers import loaded_weight, torch_only_model

PROJ = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up_proj": ("gate_proj", "up_proj"),
        "down_proj": ("down_proj",)}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """llama, hidden 64, 4 heads of 16 (2 KV heads), intermediate 128, untied head."""
    return make_tiny_model(tmp_path_factory.mktemp("hub-src"), "llama")


def _file_weights(folder, method):
    """HF projection name -> [N, K] float32 from the folder's packed tensors, by the layout's formula."""
    t = load_file(str(folder / "model.safetensors"))
    out = {}
    for name in [n for n in t if n.endswith(".qweight")]:
        p = name.removesuffix(".qweight")
        parts = {k: t[f"{p}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx") if f"{p}.{k}" in t}
        if method == "awq":
            q, s, z = hub_layout.unpack_awq(parts)
            g = torch.arange(q.shape[1]) // (q.shape[1] // s.shape[1])
        else:
            q, s, z, g = hub_layout.unpack_gptq(parts)
        g = g.long()
        out[p] = s.float()[:, g] * (q.float() - z.float()[:, g])
    return out


def _check_loaded_equals_file(folder, method, head_dim=16):
    model = torch_only_model(folder)
    want = _file_weights(folder, method)
    n = 0
    for i, layer in enumerate(model.model.layers):
        for fused, parts in PROJ.items():
            owner = layer.self_attn if fused in ("qkv_proj", "o_proj") else layer.mlp
            base = f"model.layers.{i}.{'self_attn' if owner is layer.self_attn else 'mlp'}"
            w = [want[f"{base}.{p}"] for p in parts]
            w = [interleave_rows(x, head_dim) if p in ("q_proj", "k_proj") else x for x, p in zip(w, parts)]
            assert torch.equal(loaded_weight(getattr(owner, fused)), torch.cat(w)), f"{base}.{fused}"
            n += 1
    assert n == 4 * len(model.model.layers)


@pytest.mark.parametrize("method,group,sym,act_order", [("rtn", 32, True, False), ("gptq", 64, False, True),
                                                        ("gptq", 32, True, False), ("awq", 32, False, False)])
def test_quantize_then_load_is_exact(src, tmp_path, method, group, sym, act_order):
    out = tmp_path / "q"
    qc = quantize_folder(src, out, QuantizeOptions(method, 4, group, sym, act_order, calibration_tokens=1024),
                         progress=False)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg == qc and cfg["method"] == method and cfg["bits"] == 4 and cfg["group_size"] == group
    assert cfg["symmetric"] == sym and cfg["quant_method"] == ("awq" if method == "awq" else "gptq")
    assert (cfg["calibration"] is None) == (method == "rtn")
    _check_loaded_equals_file(out, "awq" if method == "awq" else "gptq")
    llm = LLM(str(out), dtype="float32", kv_cache_memory="4MiB", progress=False)
    assert llm.info.weight_formats.startswith(("awq" if method == "awq" else "gptq") + ("-sym" if sym else ""))
    assert ("modules (" in " ".join(llm.info.layer_report())) == act_order  # act-order layers leave the C stack


def test_rtn_folder_runs_as_the_engines_own_int4(src, tmp_path):
    """Symmetric RTN written to GPTQ's layout is int4-sym's grid: the same logits, bit for bit."""
    quantize_folder(src, tmp_path / "q", QuantizeOptions("rtn", 4, 32, True), progress=False)
    a = LLM(str(tmp_path / "q"), dtype="float32", kv_cache_memory="4MiB", progress=False)
    b = LLM(str(src), dtype="float32", kv_cache_memory="4MiB", progress=False, quantization="int4",
            quant_symmetric=True)
    ids = list(range(10, 60))
    assert torch.equal(a.engine.prompt_logits(ids), b.engine.prompt_logits(ids))


SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def _hub_folder(src, out, method, sym, act_order, agree=True, coarse=False):
    """src's weights quantized by hand into the documented layout (bit formulas written out here).
    act_order: a random g_idx per input (q/k/v share one, as GPTQ gives them; agree=False: not).
    coarse: scales with 7 significant bits (then -s * z is an fp16 value whatever z)."""
    G = 32
    g = torch.Generator().manual_seed(7)
    tensors, expected, perms = {}, {}, {}
    for name, w in load_file(str(src / "model.safetensors")).items():
        p, _, leaf = name.rpartition(".")
        if leaf != "weight" or not p.split(".")[-1].endswith("_proj"):
            tensors[name] = w
            continue
        N, K = w.shape
        q = torch.randint(0, 16, (N, K), generator=g)
        z = torch.full((N, K // G), 8) if sym else torch.randint(1, 16, (N, K // G), generator=g)
        s = (torch.rand(N, K // G, generator=g) * 0.02 + 0.001).half()
        if coarse:
            s = grid.round_significand(s.float(), 7).half()
        gi = torch.arange(K) // G
        if act_order:
            key = p.rpartition(".")[0] + SHARED_INPUT.get(p.rpartition(".")[2], p) if agree else p
            gi = gi[perms.setdefault(key, torch.randperm(K, generator=g))]
        expected[p] = s.float()[:, gi] * (q - z[:, gi]).float()
        if method == "gptq":
            qw = torch.zeros(K // 8, N, dtype=torch.int64)
            for j in range(8):  # word i of column n: q[n, 8i + j] at bits 4j
                qw |= q.t()[j::8].long() << (4 * j)
            zz = torch.zeros(K // G, N // 8, dtype=torch.int64)
            for j in range(8):  # word c of group r: z[8c + j, r] - 1 at bits 4j (v1)
                zz |= (z.t()[:, j::8].long() - 1) << (4 * j)
            tensors.update({f"{p}.qweight": _i32(qw), f"{p}.qzeros": _i32(zz), f"{p}.scales": s.t().contiguous(),
                            f"{p}.g_idx": gi.to(torch.int32)})
        else:
            order = (0, 2, 4, 6, 1, 3, 5, 7)
            qw = torch.zeros(K, N // 8, dtype=torch.int64)
            zz = torch.zeros(K // G, N // 8, dtype=torch.int64)
            for j in range(8):  # word c of row k: column 8c + order[j] at bits 4j
                qw |= q.t()[:, order[j]::8].long() << (4 * j)
                zz |= z.t()[:, order[j]::8].long() << (4 * j)
            tensors.update({f"{p}.qweight": _i32(qw), f"{p}.qzeros": _i32(zz), f"{p}.scales": s.t().contiguous()})
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    for f in src.iterdir():
        if f.suffix == ".json" and f.name != "config.json" or f.name.startswith("tokenizer"):
            (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = ({"quant_method": "gptq", "bits": 4, "group_size": G, "sym": sym,
                                   "desc_act": act_order} if method == "gptq" else
                                  {"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": not sym,
                                   "version": "gemm"})
    (out / "config.json").write_text(json.dumps(cfg))
    return expected


def _i32(t):
    return torch.where(t >= 2 ** 31, t - 2 ** 32, t).to(torch.int32)


@pytest.mark.parametrize("method,sym,act_order,coarse", [
    ("gptq", True, False, False), ("gptq", False, True, True), ("gptq", False, False, False),
    ("awq", False, False, True), ("awq", True, False, False), ("awq", False, False, False)])
def test_hub_layout_folders_load_to_the_documented_values(src, tmp_path, method, sym, act_order, coarse):
    """Exact where -s * z is an fp16 value (symmetric, or scales of <= 7 significant bits); otherwise
    within the stated bound: half an fp16 ulp of s * z, at most 2^-11 * 15 |s|."""
    expected = _hub_folder(src, tmp_path / "hub", method, sym, act_order, coarse=coarse)
    exact = sym or coarse
    model = torch_only_model(tmp_path / "hub")
    for i, layer in enumerate(model.model.layers):
        for fused, parts in PROJ.items():
            owner = layer.self_attn if fused in ("qkv_proj", "o_proj") else layer.mlp
            base = f"model.layers.{i}.{'self_attn' if owner is layer.self_attn else 'mlp'}"
            w = [expected[f"{base}.{p}"] for p in parts]
            w = [interleave_rows(x, 16) if p in ("q_proj", "k_proj") else x for x, p in zip(w, parts)]
            got, want = loaded_weight(getattr(owner, fused)), torch.cat(w)
            if exact:
                assert torch.equal(got, want)
            else:
                step = getattr(owner, fused).quant.scale.float().abs().repeat_interleave(32, dim=1)  # no act-order
                assert bool(((got - want).abs() <= 15 * 2.0 ** -11 * step).all())
    # the engine (C kernels where they run) computes with the same values as a dense copy of them
    dense = tmp_path / "dense"
    dense.mkdir()
    t = load_file(str(tmp_path / "hub" / "model.safetensors"))
    t = {k: v for k, v in t.items() if not k.endswith(("qweight", "qzeros", "scales", "g_idx"))}
    t.update({f"{p}.weight": w for p, w in expected.items()})
    save_file(t, str(dense / "model.safetensors"))
    for f in src.iterdir():
        if f.suffix == ".json" or f.name.startswith("tokenizer"):
            (dense / f.name).write_bytes(f.read_bytes())
    a = LLM(str(tmp_path / "hub"), dtype="float32", kv_cache_memory="4MiB", progress=False)
    b = LLM(str(dense), dtype="float32", kv_cache_memory="4MiB", progress=False, layer_formats=(("lm_head", "int8"),))
    ids = list(range(20, 70))
    la, lb = a.engine.prompt_logits(ids), b.engine.prompt_logits(ids)
    assert (la.argmax(-1) == lb.argmax(-1)).float().mean() > 0.9  # the int4 kernel rounds x to bf16
    torch.testing.assert_close(la, lb, atol=0.05 * float(lb.abs().max()), rtol=0)


# ---- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("opts,match", [
    (QuantizeOptions("gptq", bits=3), "bits must be one of 4"),
    (QuantizeOptions("gptq", bits=8), "bits must be one of 4"),
    (QuantizeOptions("gptq", group_size=48), "group size 48 is not one of 32, 64, 128"),
    (QuantizeOptions("gptq", calibration="none"), "gptq needs calibration text"),
    (QuantizeOptions("awq", calibration="none"), "awq needs calibration text"),
    (QuantizeOptions("awq", act_order=True), "applies to gptq only"),
    (QuantizeOptions("hqq"), "method must be one of rtn, gptq, awq"),
])
def test_bad_options_are_clear_errors(opts, match):
    with pytest.raises(InvalidRequestError, match=match):
        opts.check()


def test_a_group_size_that_does_not_divide_lists_those_that_do(src, tmp_path):
    with pytest.raises(InvalidRequestError, match="group size 128 does not divide 64 input columns; group sizes "
                                                  "that do: 32, 64"):
        quantize_folder(src, tmp_path / "q", QuantizeOptions("rtn", group_size=128), progress=False)
    assert not (tmp_path / "q").exists()


def test_requantizing_a_quantized_folder_is_an_error(src, tmp_path):
    quantize_folder(src, tmp_path / "q", QuantizeOptions("rtn", group_size=32), progress=False)
    with pytest.raises(InvalidRequestError, match="already quantized"):
        quantize_folder(tmp_path / "q", tmp_path / "q2", QuantizeOptions("rtn", group_size=32), progress=False)


def test_the_held_out_text_is_never_calibration(src, tmp_path):
    from ridgeline.data import corpus
    with pytest.raises(InvalidRequestError, match="held-out"):
        quantize_folder(src, tmp_path / "q", QuantizeOptions("gptq", group_size=32,
                                                             calibration=str(corpus.TEXTS / "heldout.txt")),
                        progress=False)


def test_quantization_flag_must_match_the_folder(src, tmp_path):
    quantize_folder(src, tmp_path / "q", QuantizeOptions("rtn", group_size=32), progress=False)
    with pytest.raises(InvalidRequestError, match="quantized with gptq.*must be gptq or left out, not int4"):
        LLM(str(tmp_path / "q"), kv_cache_memory="4MiB", progress=False, quantization="int4")
    with pytest.raises(InvalidRequestError, match="has none"):
        LLM(str(src), kv_cache_memory="4MiB", progress=False, quantization="awq")
    LLM(str(tmp_path / "q"), kv_cache_memory="4MiB", progress=False, quantization="gptq")


def test_act_order_permutations_that_differ_inside_a_fused_projection_are_a_load_error(src, tmp_path):
    _hub_folder(src, tmp_path / "hub", "gptq", True, True, agree=False)
    with pytest.raises(ModelLoadError, match="g_idx differ"):
        LLM(str(tmp_path / "hub"), kv_cache_memory="4MiB", progress=False)


def test_unsupported_checkpoints_are_load_errors(src, tmp_path):
    quantize_folder(src, tmp_path / "q", QuantizeOptions("rtn", group_size=32), progress=False)
    cfg_path = tmp_path / "q" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for change, match in (({"bits": 8}, "4-bit only"), ({"group_size": -1}, "groups of 32, 64 or 128"),
                          ({"quant_method": "bitsandbytes"}, "not one this engine loads")):
        cfg_path.write_text(json.dumps({**cfg, "quantization_config": {**cfg["quantization_config"], **change}}))
        with pytest.raises(ModelLoadError, match=match):
            LLM(str(tmp_path / "q"), kv_cache_memory="4MiB", progress=False)


def test_cli_quantize(src, tmp_path, capsys):
    assert main(["quantize", str(src), "--method", "rtn", "--group-size", "32", "--symmetric", "--out",
                 str(tmp_path / "q"), "--no-progress"]) == 0
    assert "gptq layout, method rtn, 4 bits, groups of 32, symmetric" in capsys.readouterr().err
    assert main(["quantize", str(tmp_path / "q"), "--method", "rtn", "--group-size", "32", "--out",
                 str(tmp_path / "q2")]) == 2
    assert "already quantized" in capsys.readouterr().err
    assert main(["quantize", str(src), "--bits", "3", "--out", str(tmp_path / "q3")]) == 2
    assert "bits must be one of 4" in capsys.readouterr().err


def test_a_tied_qwen2_folder_quantizes_and_loads(tmp_path):
    """qkv bias and a tied embedding: the biases stay float beside the packed weights, the head is int8."""
    src = make_tiny_model(tmp_path / "src", "qwen2")
    quantize_folder(src, tmp_path / "q", QuantizeOptions("awq", 4, 32, False, calibration_tokens=512),
                    progress=False)
    assert "model.layers.0.self_attn.q_proj.bias" in load_file(str(tmp_path / "q" / "model.safetensors"))
    llm = LLM(str(tmp_path / "q"), dtype="float32", kv_cache_memory="4MiB", progress=False)
    assert llm.info.weight_formats == "awq x 8, int8 x 1"
    ref = LLM(str(src), dtype="float32", kv_cache_memory="4MiB", progress=False)
    ids = list(range(30, 80))
    a, b = llm.engine.prompt_logits(ids), ref.engine.prompt_logits(ids)
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) > 0.6


def test_eval_sweep_names_the_quantizations_it_can_sweep():
    from ridgeline.eval.sweep import sweep_settings
    with pytest.raises(InvalidRequestError, match="--sweep takes --quantization none, auto, int8, w8a8, int4, w4a8, gguf; got gptq"):
        sweep_settings({"quantization": "gptq"})
