"""GGUF MoE files (llama.cpp's stacked ffn_{gate,up,down}_exps, ffn_gate_inp, the shared-expert
tensors, Qwen3's q/k norms): a tiny transformers model written as GGUF with the gguf package converts
back to exactly its HF tensors and runs with the same logits as transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T, GGUFWriter, quants

from ridgeline import LLM
from ridgeline.gguf.convert import ensure_converted
from conftest import make_tiny_model
from test_gguf import CHAT, MERGES, llama_permute, tiny_vocab
from test_hf_parity import engine_logits, hf_model

GGUF_ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "qwen3": "qwen3"}
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
          "block_sparse_moe.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
          "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
          "mlp.shared_expert_gate": "ffn_gate_inp_shexp", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}
_EXPERT = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps", "w3": "ffn_up_exps",
           "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}


def _gguf_tensors(state: dict, cfg) -> dict[str, np.ndarray]:
    """HF state dict -> llama.cpp tensors (experts stacked, q/k permuted for Mixtral)."""
    out, experts = {}, {}
    globals_ = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
    for name, w in state.items():
        w = w.float().numpy()
        if name in globals_:
            out[globals_[name]] = w
            continue
        _, _, layer, rest = name.split(".", 3)
        module, _, suffix = rest.rpartition(".")
        if ".experts." in module:
            e, proj = module.split(".experts.")[1].split(".")
            experts.setdefault((layer, _EXPERT[proj]), {})[int(e)] = w
            continue
        if module == "mlp.shared_expert_gate":
            w = w.reshape(-1)
        if cfg.model_type == "mixtral" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            w = llama_permute(w, cfg.num_attention_heads if "q_proj" in module else cfg.num_key_value_heads)
        out[f"blk.{layer}.{_LAYER[module]}.{suffix}"] = w
    for (layer, kind), per in experts.items():
        out[f"blk.{layer}.{kind}.weight"] = np.stack([per[e] for e in sorted(per)])
    return out


def write_moe_gguf(path, folder, arch: str, qtype=None) -> None:
    """qtype: the GGML type of every matrix (the stacked experts included; None: float32)."""
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(folder)
    tokens, types = tiny_vocab()
    w = GGUFWriter(str(path), GGUF_ARCH[arch])
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(512)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch != "qwen3":
        w.add_expert_count(getattr(cfg, "num_experts", None) or cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if arch in ("qwen2_moe", "qwen3_moe"):
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_weights_norm(bool(cfg.norm_topk_prob))
    if arch == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    for add, value in [(w.add_tokenizer_model, "gpt2"), (w.add_tokenizer_pre, "qwen2"), (w.add_token_list, tokens),
                       (w.add_token_types, types), (w.add_token_merges, MERGES), (w.add_bos_token_id, 1),
                       (w.add_eos_token_id, 2), (w.add_add_bos_token, False), (w.add_chat_template, CHAT)]:
        add(value)
    from safetensors.torch import load_file
    for name, t in _gguf_tensors(load_file(folder / "model.safetensors"), cfg).items():
        t = np.ascontiguousarray(t)
        if qtype is None or t.ndim == 1 or name == "token_embd.weight" or t.shape[-1] % 32:  # as llama.cpp falls back
            w.add_tensor(name, t)
        else:
            w.add_tensor(name, quants.quantize(t, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe", "qwen3"])
def test_gguf_moe_converts_and_matches_transformers(arch, tmp_path, monkeypatch):
    from safetensors.torch import load_file
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    extra = {"mlp_only_layers": []} if arch == "qwen2_moe" else {}  # llama.cpp's qwen2moe: every layer sparse
    folder = make_tiny_model(tmp_path / "hf", arch, vocab_size=len(tiny_vocab()[0]), tie_word_embeddings=False,
                             **extra)
    write_moe_gguf(tmp_path / f"{arch}.gguf", folder, arch)
    converted = ensure_converted(tmp_path / f"{arch}.gguf", progress=False, weights=True)
    want, got = load_file(folder / "model.safetensors"), load_file(converted / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name

    llm = LLM(str(tmp_path / f"{arch}.gguf"), dtype="float32", kv_cache_memory="4MiB", progress=False)
    assert llm.engine.runner.model.cfg.architecture == hf_model(folder).config.architectures[0]
    ids = [[5, 9, 33, 120, 7, 7, 8, 60], list(range(40, 70))]
    ref = hf_model(folder)
    for prompt_ids, logits in zip(ids, engine_logits(llm, ids, 1000)):
        with torch.no_grad():
            torch.testing.assert_close(logits, ref(torch.tensor([prompt_ids])).logits[0], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0])
def test_gguf_moe_experts_keep_their_blocks(arch, qtype, tmp_path, monkeypatch):
    """A quantized MoE file's stacked experts load as each expert's blocks (never decoded: "Q8_0 kept"
    for every expert), every layer in the C stack, with the logits of the same blocks decoded to floats
    (--quantization none) up to the kept formats' activation rounding."""
    monkeypatch.setenv("RIDGELINE_HOME", str(tmp_path / "home"))
    extra = {"mlp_only_layers": []} if arch == "qwen2_moe" else {}
    folder = make_tiny_model(tmp_path / "hf", arch, vocab_size=len(tiny_vocab()[0]), tie_word_embeddings=False,
                             **extra)
    path = tmp_path / f"{arch}-{qtype.name}.gguf"
    write_moe_gguf(path, folder, arch, qtype)
    kept = LLM(str(path), dtype="float32", kv_cache_memory="4MiB", progress=False)
    floats = LLM(str(path), dtype="float32", kv_cache_memory="4MiB", progress=False, quantization="none")
    assert f"{qtype.name} kept" in kept.info.weight_formats
    for layer in kept.engine.runner.model.model.layers:
        if hasattr(layer.mlp, "num_experts"):
            for _, ex in layer.mlp.expert_items():
                for lin in (ex.gate_up_proj, ex.down_proj):  # blocks where the file has them (K a multiple of 32)
                    assert (getattr(lin, "kept", "") == f"{qtype.name} kept") == (lin.in_features % 32 == 0)
    if kept.info.kernel_plan.c_stack:
        assert all(p is None for p in kept.info.layer_paths)
    assert kept.info.weight_bytes < floats.info.weight_bytes
    ids = [[5, 9, 33, 120, 7, 7, 8, 60], list(range(40, 70))]
    for got, want in zip(engine_logits(kept, ids, 1000), engine_logits(floats, ids, 1000)):
        rel = float((got - want).abs().max() / want.abs().max())
        assert rel < 0.02, rel  # the kept kernels round x to bf16 where the CPU has AVX512-BF16
