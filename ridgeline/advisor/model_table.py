"""Popular model configurations, as the published config.json fields (Hugging Face key names).

Only the fields the advisor reads are kept; parameter counts are derived from them (model_spec.py),
which doubles as a check: the derived totals land on the published sizes (8.03B, 70.6B, 405.9B, ...).
"""
from __future__ import annotations

_LLAMA31 = {"architectures": ["LlamaForCausalLM"], "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "tie_word_embeddings": False}
_QWEN25 = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064, "max_position_embeddings": 131072,
           "tie_word_embeddings": False}

TABLE: dict[str, dict] = {
    "SmolLM2-135M": {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "hidden_size": 576,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
                     "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True},
    "Llama-3.1-8B": {**_LLAMA31, "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                     "intermediate_size": 14336},
    "Llama-3.1-70B": {**_LLAMA31, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                      "intermediate_size": 28672},
    "Llama-3.1-405B": {**_LLAMA31, "num_hidden_layers": 126, "hidden_size": 16384, "num_attention_heads": 128,
                       "intermediate_size": 53248},
    "Qwen2.5-7B": {**_QWEN25, "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "intermediate_size": 18944},
    "Qwen2.5-72B": {**_QWEN25, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "intermediate_size": 29568},
    "Mistral-7B-v0.3": {"architectures": ["MistralForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                        "vocab_size": 32768, "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "Mixtral-8x7B": {"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                     "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": False,
                     "num_local_experts": 8, "num_experts_per_tok": 2},
    "DeepSeek-V3": {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
                    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False},
}


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


_ALIASES = {"mistral7b": "Mistral-7B-v0.3", "deepseekv3671b": "DeepSeek-V3"}


def lookup(name: str) -> tuple[str, dict] | None:
    """Case- and punctuation-insensitive: 'llama-3.1-70b', 'Llama3.1-70B' and 'meta-llama/Llama-3.1-70B' match."""
    key = _norm(name.rsplit("/", 1)[-1])
    for suffix in ("instruct", "base"):
        if key.endswith(suffix) and key != suffix:
            key = key[: -len(suffix)]
    canonical = _ALIASES.get(key) or next((n for n in TABLE if _norm(n) == key), None)
    return (canonical, TABLE[canonical]) if canonical else None
