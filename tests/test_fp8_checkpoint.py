"""FP8 checkpoints (weights/fp8_checkpoint.py): a folder in the compressed-tensors float8 layout (float8_e4m3fn
weight + per-channel or per-tensor weight_scale, input_scale) or with quant_method "fp8" loads into the
fp8 format with the checkpoint's own values and scales, never re-quantized; the LM head the checkpoint
keeps in float stays float; an explicit other quantization sees the dequantized values; block-wise fp8
is a clear error."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ridgeline import LLM
from ridgeline.errors import ModelLoadError
from ridgeline.kernels import cpu_quant
from ridgeline.layers.rotary import interleave_rows
from ridgeline.formats import fpq
from conftest import make_tiny_model

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_fp8_folder(src, dst, per_tensor: bool, method: str):
    """The tiny model's folder with every projection stored as fp8 the way the layouts document it."""
    import shutil
    shutil.copytree(src, dst)
    state = load_file(str(src / "model.safetensors"))
    out = {}
    for name, t in state.items():
        if name.endswith(".weight") and name.split(".")[-2] in PROJ:
            q = fpq.quantize_fp8(t, "e4m3", per_tensor)
            out[name] = q.q
            prefix = name[:-len(".weight")]
            out[prefix + ".weight_scale"] = q.scale[:1].reshape(()) if per_tensor else q.scale[:, None]
            out[prefix + ".input_scale"] = torch.tensor(0.02)
        else:
            out[name] = t
    (dst / "model.safetensors").unlink()
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    if method == "compressed-tensors":
        strategy = "tensor" if per_tensor else "channel"
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                                                      "symmetric": True, "dynamic": False},
                                          "input_activations": {"num_bits": 8, "type": "float",
                                                                "strategy": "tensor", "dynamic": False}}}}
    else:
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst, out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("fp8src"), "llama")  # untied: a float lm_head tensor


def _llm(folder, **kw):
    return LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False, **kw)


def _expected(ckpt, prefix, parts, head_dim):
    """The fp8 tensor the fused layer must hold: parts' q and per-row scales, q/k rows interleaved."""
    qs, ss = [], []
    for p in parts:
        q, s = ckpt[f"{prefix}.{p}.weight"], ckpt[f"{prefix}.{p}.weight_scale"].float()
        s = s.reshape(-1).expand(q.shape[0]) if s.numel() == 1 else s.reshape(-1)
        if p in ("q_proj", "k_proj"):
            q, s = interleave_rows(q, head_dim), interleave_rows(s.contiguous(), head_dim)
        qs.append(q)
        ss.append(s)
    return fpq.Fp8Tensor(torch.cat(qs), torch.cat(ss).contiguous())


@pytest.mark.parametrize("per_tensor,method", [(False, "compressed-tensors"), (True, "compressed-tensors"),
                                               (True, "fp8")])
def test_fp8_checkpoint_loads_its_own_values(tiny, tmp_path, per_tensor, method):
    folder, ckpt = write_fp8_folder(tiny, tmp_path / "fp8", per_tensor, method)
    llm = _llm(folder)
    model = llm.engine.runner.model
    assert llm.info.weight_formats == "fp8 x 8, f32 x 1"  # the LM head stays as the checkpoint has it
    layer = model.model.layers[1]
    head_dim = model.model.layers[0].self_attn.d
    for lin, prefix, parts in [(layer.self_attn.qkv_proj, "model.layers.1.self_attn", ("q_proj", "k_proj", "v_proj")),
                               (layer.mlp.down_proj, "model.layers.1.mlp", ("down_proj",))]:
        want = _expected(ckpt, prefix, parts, head_dim)
        if lin.packed is not None:
            from ridgeline.kernels.cpu_fpquant import PackedFp8
            ref = PackedFp8(want)
            assert torch.equal(lin.packed.data, ref.data) and torch.equal(lin.packed.scale, ref.scale)
        else:
            assert torch.equal(lin.quant.q.view(torch.uint8), want.q.view(torch.uint8))
            assert torch.equal(lin.quant.scale, want.scale)
    if cpu_quant.available("fp8") and llm.info.kernel_plan.c_stack:
        assert llm.info.layer_paths == (None, None)
    ids = list(range(40, 100))
    got = llm.engine.prompt_logits(ids)
    if not per_tensor:  # the same numbers as quantizing the float model per channel here
        same = _llm(tiny, quantization="fp8", layer_formats=[("lm_head", "f32")])
        assert torch.equal(same.engine.prompt_logits(ids), got)
    ref = _llm(tiny).engine.prompt_logits(ids)
    assert float((got - ref).abs().max() / ref.abs().max()) < 0.2  # measured 0.09 (per channel)
    # an explicit other quantization re-quantizes the checkpoint's (dequantized) values
    q8 = _llm(folder, quantization="int8")
    assert q8.info.weight_formats == "int8 x 9"
    assert float((q8.engine.prompt_logits(ids) - got).abs().max() / got.abs().max()) < 0.05
    # an explicit none dequantizes them to --dtype (the default, auto, keeps them)
    dense = _llm(folder, quantization="none")
    assert "fp8" not in dense.info.weight_formats
    assert float((dense.engine.prompt_logits(ids) - got).abs().max() / got.abs().max()) < 1e-4


def test_block_wise_fp8_is_a_clear_error(tiny, tmp_path):
    folder, _ = write_fp8_folder(tiny, tmp_path / "fp8b", False, "fp8")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [128, 128]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"block-wise fp8 \(weight_block_size \[128, 128\]\) is not supported; "
                                             r"fp8 checkpoints load with a per-tensor or per-channel weight_scale"):
        _llm(folder)
