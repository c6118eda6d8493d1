"""GPT-OSS beyond the family tests' parity (tests/test_families.py runs its tiny model like every family):
its MXFP4 checkpoints load the experts' blocks as stored into the mxfp4 kernel (no float copy), the
blocks decode to what OpenAI's reference decodes, and its checkpoint layouts fail clearly when broken."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ridgeline import LLM
from ridgeline.errors import ModelLoadError
from ridgeline.formats import fpq
from ridgeline.weights.mxfp4_checkpoint import MxBlocks
from conftest import make_tiny_model
from test_hf_parity import PROMPTS, engine_logits, hf_model

OPTS = dict(dtype="float32", kv_cache_memory="4MiB", max_model_len=256)
EXPERT_WEIGHTS = ("experts.gate_up_proj", "experts.down_proj")


def write_folder(src: Path, dst: Path, tensors: dict, quant_config: dict | None = None) -> Path:
    shutil.copytree(src, dst)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if quant_config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"] = quant_config
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(an MXFP4 checkpoint of the tiny GPT-OSS model, the same weights decoded to floats): the experts'
    [E, in, out] weights quantized as [E, out, in] blocks, as OpenAI's checkpoints store them."""
    root = tmp_path_factory.mktemp("gpt-oss")
    src = make_tiny_model(root / "float", "gpt_oss")
    mx, dense = {}, {}
    for name, w in load_file(str(src / "model.safetensors")).items():
        if not name.endswith(EXPERT_WEIGHTS):
            mx[name] = dense[name] = w
            continue
        E, K, N = w.shape
        bt = fpq.quantize(w.transpose(1, 2).reshape(E * N, K), "mxfp4")
        codes = bt.q.view(E, N, K // 32, 16, 2)
        mx[name + "_blocks"] = (codes[..., 0] | (codes[..., 1] << 4)).contiguous()
        mx[name + "_scales"] = bt.scale.view(E, N, K // 32).contiguous()
        dense[name] = bt.dequantize().view(E, N, K).transpose(1, 2).contiguous()
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                               "model.embed_tokens", "lm_head"]}
    return write_folder(src, root / "mxfp4", mx, qc), write_folder(src, root / "decoded", dense), mx


def test_mxfp4_checkpoint_keeps_the_experts_blocks(folders):
    """The experts load as the checkpoint's blocks (the start-up line says so; they read the file's bytes, not
    floats), and compute exactly what the mxfp4 format computes on the same values decoded; every other
    tensor is dense. --quantization none decodes them and matches transformers on the decoded weights."""
    mx, decoded, tensors = folders
    kept = LLM(str(mx), **OPTS)
    assert "mxfp4 (checkpoint blocks) x 32" in kept.info.weight_formats  # 4 layers x 4 experts x (gate_up, down)
    expert_bytes = sum(t.numel() for n, t in tensors.items() if n.endswith(("_blocks", "_scales")))
    dense_bytes = LLM(str(decoded), **OPTS).info.weight_bytes
    assert kept.info.weight_bytes < dense_bytes - 3 * expert_bytes  # fp32 experts read 7.5x the blocks' bytes
    same = LLM(str(decoded), layer_formats=[("*.mlp.experts.*", "mxfp4")], **OPTS)
    ids = [kept.tokenizer.encode(p) for p in PROMPTS]
    for got, want in zip(engine_logits(kept, ids, 1000), engine_logits(same, ids, 1000)):
        assert torch.equal(got, want)
    ref = hf_model(decoded)
    for prompt_ids, got in zip(ids, engine_logits(LLM(str(mx), quantization="none", **OPTS), ids, 1000)):
        with torch.no_grad():
            want = ref(torch.tensor([prompt_ids])).logits[0]
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_mxfp4_blocks_decode_as_openai_reference():
    """Element 2j in a byte's low nibble, 2j + 1 in its high one, the FP4 table, times 2^(scale - 127)."""
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 2, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(100, 140, (3, 2), dtype=torch.uint8, generator=g)
    lut = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    want = torch.empty(3, 2, 32)
    for r in range(3):
        for b in range(2):
            for j in range(16):
                byte = int(blocks[r, b, j])
                for half, code in ((0, byte & 15), (1, byte >> 4)):
                    want[r, b, 2 * j + half] = lut[code] * 2.0 ** (int(scales[r, b]) - 127)
    assert torch.equal(MxBlocks(blocks, scales).dequantize(), want.view(3, 64))


def _broken(folders, tmp_path, edit) -> Path:
    mx, _, tensors = folders
    t = dict(tensors)
    edit(t)
    return write_folder(mx, tmp_path / "broken", t, json.loads((mx / "config.json").read_text())["quantization_config"])


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("model.layers.1.mlp.experts.down_proj_scales"), "down_proj_scales is missing"),
    (lambda t: t["model.layers.0.mlp.experts.gate_up_proj_scales"].view(-1)[5].fill_(255), "255"),
    (lambda t: t.update({"model.layers.0.mlp.experts.down_proj_bias": torch.zeros(3, 64)}), "3 stacked experts|shape"),
], ids=["half-pair", "nan-scale", "expert-count"])
def test_broken_mxfp4_checkpoints_are_clear_errors(folders, tmp_path, edit, match):
    with pytest.raises(ModelLoadError, match=match):
        LLM(str(_broken(folders, tmp_path, edit)), **OPTS)


def test_mxfp4_blocks_under_tensor_parallelism_are_a_clear_error(folders):
    mx, _, _ = folders
    with pytest.raises(Exception, match="tensor-parallel"):
        LLM(str(mx), tensor_parallel_size=2, **OPTS)
