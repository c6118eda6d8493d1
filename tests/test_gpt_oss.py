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


# ---------------------------------------------------------------- GGUF files (llama.cpp's gpt-oss layout)
def write_gpt_oss_gguf(folder: Path, path: Path, expert_type) -> dict:
    """The tiny model as llama.cpp's converter writes GPT-OSS: gate and up de-interleaved into stacked
    [E, I, hidden] tensors with their biases, the sinks as attn_sinks.weight, the experts in expert_type
    (MXFP4 as its quantizer rounds them). Returns the HF state dict with the experts as the file decodes them."""
    import numpy as np
    import transformers
    from gguf import GGMLQuantizationType as T, GGUFWriter, quants
    from test_gguf import CHAT, MERGES, tiny_vocab

    cfg = transformers.AutoConfig.from_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    tokens, types = tiny_vocab()
    w = GGUFWriter(str(path), "gpt-oss")
    for key, value in [("block_count", cfg.num_hidden_layers), ("context_length", 512),
                       ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads),
                       ("attention.head_count_kv", cfg.num_key_value_heads), ("attention.key_length", cfg.head_dim),
                       ("attention.value_length", cfg.head_dim), ("expert_count", cfg.num_local_experts),
                       ("expert_used_count", cfg.num_experts_per_tok),
                       ("expert_feed_forward_length", cfg.intermediate_size),
                       ("attention.sliding_window", cfg.sliding_window),
                       ("rope.scaling.original_context_length", cfg.rope_parameters["original_max_position_embeddings"])]:
        w.add_uint32(f"gpt-oss.{key}", value)
    w.add_float32("gpt-oss.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_float32("gpt-oss.rope.freq_base", cfg.rope_parameters["rope_theta"])
    w.add_string("gpt-oss.rope.scaling.type", "yarn")
    w.add_float32("gpt-oss.rope.scaling.factor", cfg.rope_parameters["factor"])
    for add, value in [(w.add_tokenizer_model, "gpt2"), (w.add_tokenizer_pre, "qwen2"), (w.add_token_list, tokens),
                       (w.add_token_types, types), (w.add_token_merges, MERGES), (w.add_bos_token_id, 1),
                       (w.add_eos_token_id, 2), (w.add_add_bos_token, False), (w.add_chat_template, CHAT)]:
        add(value)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
             "self_attn.sinks": "attn_sinks.weight", "mlp.router.weight": "ffn_gate_inp.weight",
             "mlp.router.bias": "ffn_gate_inp.bias"}
    for p in ("q", "k", "v"):
        layer |= {f"self_attn.{p}_proj.{s}": f"attn_{p}.{s}" for s in ("weight", "bias")}
    layer |= {f"self_attn.o_proj.{s}": f"attn_output.{s}" for s in ("weight", "bias")}
    decoded = dict(state)
    for name, t in state.items():
        a = t.float().numpy()
        if name in names:
            w.add_tensor(names[name], a)
            continue
        _, _, i, rest = name.split(".", 3)
        if rest in layer:
            w.add_tensor(f"blk.{i}.{layer[rest]}", a)
            continue
        if rest == "mlp.experts.gate_up_proj_bias":
            w.add_tensor(f"blk.{i}.ffn_gate_exps.bias", np.ascontiguousarray(a[:, 0::2]))
            w.add_tensor(f"blk.{i}.ffn_up_exps.bias", np.ascontiguousarray(a[:, 1::2]))
            continue
        if rest == "mlp.experts.down_proj_bias":
            w.add_tensor(f"blk.{i}.ffn_down_exps.bias", a)
            continue
        if rest == "mlp.experts.gate_up_proj":  # [E, hidden, 2I] -> gate, up [E, I, hidden]
            parts = {"ffn_gate_exps": a[:, :, 0::2].transpose(0, 2, 1), "ffn_up_exps": a[:, :, 1::2].transpose(0, 2, 1)}
        else:  # down [E, I, hidden] -> [E, hidden, I]
            parts = {"ffn_down_exps": a.transpose(0, 2, 1)}
        back = {}
        for kind, m in parts.items():
            m = np.ascontiguousarray(m)
            if expert_type == T.F32:
                w.add_tensor(f"blk.{i}.{kind}.weight", m)
                back[kind] = m
            else:
                raw = quants.quantize(m, expert_type)
                w.add_tensor(f"blk.{i}.{kind}.weight", raw, raw_dtype=expert_type)
                back[kind] = quants.dequantize(raw, expert_type).reshape(m.shape)
        if "ffn_down_exps" in back:
            decoded[name] = torch.from_numpy(back["ffn_down_exps"].transpose(0, 2, 1).copy())
        else:
            gu = np.empty_like(a)
            gu[:, :, 0::2], gu[:, :, 1::2] = back["ffn_gate_exps"].transpose(0, 2, 1), back["ffn_up_exps"].transpose(0, 2, 1)
            decoded[name] = torch.from_numpy(gu)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return decoded


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    from gguf import GGMLQuantizationType as T
    from test_gguf import tiny_vocab
    root = tmp_path_factory.mktemp("gpt-oss-gguf")
    # llama.cpp hard-codes the clamped SwiGLU's limit (7.0): the GGUF files carry none of their own
    folder = make_tiny_model(root / "hf", "gpt_oss", vocab_size=len(tiny_vocab()[0]), swiglu_limit=7.0)
    files = {}
    for q in (T.F32, T.MXFP4):
        decoded = write_gpt_oss_gguf(folder, root / f"{q.name}.gguf", q)
        files[q] = (root / f"{q.name}.gguf", write_folder(folder, root / f"decoded-{q.name}", decoded))
    return files


@pytest.fixture()
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))


IDS = [[5, 9, 33, 120, 7, 7, 8, 60], list(range(40, 70))]


@pytest.mark.usefixtures("_home")
def test_gpt_oss_gguf_converts_to_transformers_logits(gguf_files):
    """llama.cpp's gpt-oss names and layout (de-interleaved experts, attn_sinks, post_attention_norm, the
    router's bias, every 2nd layer global, YaRN) read back to the model transformers runs: dense, and MXFP4
    experts decoded (--quantization none)."""
    from gguf import GGMLQuantizationType as T
    for q in (T.F32, T.MXFP4):
        path, decoded = gguf_files[q]
        llm = LLM(str(path), quantization="none", progress=False, **OPTS)
        assert llm.engine.runner.model.cfg.architecture == "GptOssForCausalLM"
        assert [layer.self_attn.attn.window for layer in llm.engine.runner.model.model.layers] == [6, None, 6, None]
        ref = hf_model(decoded)
        for prompt_ids, got in zip(IDS, engine_logits(llm, IDS, 1000)):
            with torch.no_grad():
                torch.testing.assert_close(got, ref(torch.tensor([prompt_ids])).logits[0], atol=2e-4, rtol=1e-4)


@pytest.mark.usefixtures("_home")
def test_gpt_oss_gguf_keeps_its_mxfp4_experts(gguf_files):
    """The file's MXFP4 experts load as the mxfp4 format's blocks ("MXFP4 kept (mxfp4)"), every layer in the
    C stack, and compute what the mxfp4 format computes on the same values decoded to floats."""
    from gguf import GGMLQuantizationType as T
    path, decoded = gguf_files[T.MXFP4]
    kept = LLM(str(path), progress=False, **OPTS)
    assert "MXFP4 kept (mxfp4) x 32" in kept.info.weight_formats
    if kept.info.kernel_plan.c_stack:
        assert all(p is None for p in kept.info.layer_paths)
    same = LLM(str(decoded), layer_formats=[("*.mlp.experts.*", "mxfp4")], **OPTS)
    for got, want in zip(engine_logits(kept, IDS, 1000), engine_logits(same, IDS, 1000)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
