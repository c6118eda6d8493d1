"""GGUF files of the Gemma 2, Gemma 3 and Phi-3/Phi-4-mini families, written here from the tiny HF models with
llama.cpp's converter's conventions (its tensor names, Gemma's norms stored as 1 + w, Phi-3's fused attn_qkv and
ffn_up and its LongRoPE factor tensors, the metadata keys it writes; checked against files that converter
made, see the closing test's note): converted to float32 they give transformers' logits, and with their
Q8_0 blocks kept every layer the C stack can run runs there, near the float logits."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T, GGUFWriter, quants
from safetensors.torch import load_file

from conftest import make_tiny_model
from ridgeline import LLM
from test_gguf import CHAT, MERGES, tiny_vocab
from test_hf_parity import engine_logits, hf_model

# configs as llama.cpp runs them: queries scaled by 1/sqrt(head_dim), Gemma 3's 5:1 pattern, Gemma 2's 1:1
SHAPES = {
    "gemma3": dict(num_hidden_layers=7, query_pre_attn_scalar=32,
                   layer_types=["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]),
    "gemma2": dict(query_pre_attn_scalar=16),
    "phi3": {}, "phi4": {},
}
GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "post_attention_layernorm": "ffn_norm", "self_attn.qkv_proj": "attn_qkv",
         "mlp.gate_up_proj": "ffn_up"}
GEMMA_LAYER = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}
PROMPTS = [list(range(100, 140)), [5, 300, 200, 77, 300, 12, 12, 12, 9]]


def gguf_name(hf: str, gemma: bool) -> str:
    base, _, suffix = hf.rpartition(".")
    if base in GLOBAL:
        return f"{GLOBAL[base]}.{suffix}"
    _, _, i, rest = base.split(".", 3)
    return f"blk.{i}.{(GEMMA_LAYER if gemma else {}).get(rest) or LAYER[rest]}.{suffix}"


def write_family_gguf(folder, path, family: str, qtype) -> None:
    import json
    cfg = json.loads((folder / "config.json").read_text())
    arch = "phi3" if family.startswith("phi") else family
    gemma = arch.startswith("gemma")
    w = GGUFWriter(str(path), arch)
    tokens, types = tiny_vocab()
    for add, value in [(w.add_tokenizer_model, "gpt2"), (w.add_tokenizer_pre, "smollm"), (w.add_token_list, tokens),
                       (w.add_token_types, types), (w.add_token_merges, MERGES), (w.add_bos_token_id, 1),
                       (w.add_eos_token_id, 2), (w.add_add_bos_token, False), (w.add_chat_template, CHAT)]:
        add(value)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    for key, value in [("block_count", cfg["num_hidden_layers"]), ("context_length", cfg["max_position_embeddings"]),
                       ("embedding_length", cfg["hidden_size"]), ("feed_forward_length", cfg["intermediate_size"]),
                       ("attention.head_count", cfg["num_attention_heads"]),
                       ("attention.head_count_kv", cfg["num_key_value_heads"]), ("attention.key_length", hd),
                       ("attention.value_length", hd)]:
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    if arch == "gemma2":
        w.add_uint32("gemma2.attention.sliding_window", cfg["sliding_window"])
        w.add_float32("gemma2.attn_logit_softcapping", cfg["attn_logit_softcapping"])
        w.add_float32("gemma2.final_logit_softcapping", cfg["final_logit_softcapping"])
    if arch == "gemma3":
        w.add_uint32("gemma3.attention.sliding_window", cfg["sliding_window"])
        full, local = rope["full_attention"], rope["sliding_attention"]
        w.add_float32("gemma3.rope.freq_base", full["rope_theta"])
        w.add_float32("gemma3.rope.freq_base_swa", local["rope_theta"])
        if full["rope_type"] != "default":
            w.add_string("gemma3.rope.scaling.type", full["rope_type"])
            w.add_float32("gemma3.rope.scaling.factor", full["factor"])
    if arch == "phi3":
        rot = int(hd * rope.get("partial_rotary_factor", 1.0))
        w.add_uint32("phi3.rope.dimension_count", rot)
        w.add_uint32("phi3.rope.scaling.original_context_length", rope["original_max_position_embeddings"])
        w.add_float32("phi3.rope.freq_base", rope["rope_theta"])
        w.add_uint32("phi3.attention.sliding_window", 0)
        for k in ("long", "short"):
            w.add_tensor(f"rope_factors_{k}.weight", np.array(rope[f"{k}_factor"], dtype=np.float32))
    for name, t in load_file(str(folder / "model.safetensors")).items():
        a = t.float().numpy()
        if gemma and name.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp's converter stores Gemma's (1 + w)
        g = gguf_name(name, gemma)
        if a.ndim == 2 and qtype != T.F32:
            w.add_tensor(g, quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(g, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=list(SHAPES))
def family(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"gguf-{request.param}")
    folder = make_tiny_model(d / "hf", request.param, **SHAPES[request.param])
    files = {}
    for q in (T.F32, T.Q8_0):
        files[q] = d / f"{request.param}-{q.name}.gguf"
        write_family_gguf(folder, files[q], request.param, q)
    return request.param, folder, files


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))


def test_float_files_convert_to_transformers_logits(family):
    arch, folder, files = family
    ref = hf_model(folder)
    llm = LLM(str(files[T.F32]), dtype="float32", quantization="none", kv_cache_memory="4MiB", max_model_len=256)
    assert llm.engine.runner.model.cfg.architecture == ref.config.architectures[0]
    for p, got in zip(PROMPTS, engine_logits(llm, PROMPTS, 9)):
        with torch.no_grad():
            want = ref(torch.tensor([p])).logits[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_q8_0_blocks_kept_run_in_the_stack_near_the_float_logits(family):
    """Kept blocks against the same file's blocks dequantized to float32: what is left is the kernels'
    arithmetic (int8 activations where the kept format uses them)."""
    arch, folder, files = family
    ref = LLM(str(files[T.Q8_0]), dtype="float32", quantization="none", kv_cache_memory="4MiB", max_model_len=256)
    llm = LLM(str(files[T.Q8_0]), dtype="float32", kv_cache_memory="4MiB", max_model_len=256)
    paths = llm.info.layer_paths
    assert all(p is None for p in paths), paths
    assert "q8_0" in llm.info.weight_formats.lower() or "gguf" in llm.info.weight_formats.lower()
    for got, want in zip(engine_logits(llm, PROMPTS, 9), engine_logits(ref, PROMPTS, 9)):
        assert ((got - want).norm() / want.norm()).item() < 0.02
