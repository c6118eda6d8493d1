"""What each supported architecture's layers are made of, as data: the facts a config.json does not
spell out because transformers hard-codes them per model class. hf_config reads a config's numbers
against its family here; models/layer_spec.py turns both into each layer's declaration, which the
module path and the C decoder stack read alike. A new architecture of known parts is a row here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Family:
    norm_offset: bool = False  # RMSNorm weights stored as w, applied as (1 + w) (Gemma)
    sandwich_norms: bool = False  # norms on the attention and MLP outputs too, before each residual add
    qk_norm: bool = False  # per-head RMSNorm of q and k before rotary (Qwen3, Gemma 3)
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size) (Gemma)
    qkv_bias: bool = False  # q/k/v projections carry a bias whatever `attention_bias` says (Qwen2)
    window_pattern: int = 0  # configs without layer_types: every p-th layer global, the rest local
    local_rope: bool = False  # local layers have their own rotary base (`rope_local_base_freq`, Gemma 3)
    fused_checkpoint: bool = False  # checkpoints store qkv_proj and gate_up_proj fused (Phi-3)
    query_scalar: bool = False  # scores scaled by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5
    softcaps: bool = False  # attn_logit_softcapping / final_logit_softcapping are read (Gemma 2)
    moe: bool = False  # sparse MLP layers (hf_config reads their sizes)
    sinks: bool = False  # a learned attention-sink logit per query head (`self_attn.sinks`, GPT-OSS)
    # the experts of a layer stored as stacked tensors [E, in, out] with gate and up interleaved column by
    # column, and biases (GPT-OSS): split into each expert's projections at load (models/expert_split.py)
    stacked_experts: bool = False
    # checkpoint name prefix -> ours, for checkpoints that nest the text model (Gemma 3 multimodal)
    prefixes: tuple[tuple[str, str], ...] = ()
    # checkpoint names of another model part this engine does not run (a vision tower): skipped
    skipped: tuple[str, ...] = ()
    # per-layer module renames, checkpoint -> ours (Gemma's four norms onto our two plus two; a part may
    # become a dotted path: GPT-OSS's `sinks` belong to our attention module)
    renames: tuple[tuple[str, str], ...] = ()
    # config fields a nested text config may leave out (written as differences from the class defaults)
    defaults: tuple[tuple[str, object], ...] = ()


LLAMA = Family()
_GEMMA_NORMS = (("post_attention_layernorm", "attn_out_norm"), ("pre_feedforward_layernorm", "post_attention_layernorm"),
                ("post_feedforward_layernorm", "mlp_out_norm"))
GEMMA2 = Family(norm_offset=True, sandwich_norms=True, embed_scale=True, window_pattern=2, query_scalar=True,
                softcaps=True, renames=_GEMMA_NORMS)
GEMMA3 = Family(norm_offset=True, sandwich_norms=True, qk_norm=True, embed_scale=True, window_pattern=6,
                local_rope=True, query_scalar=True, softcaps=True, renames=_GEMMA_NORMS)

FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": LLAMA,
    "Qwen2ForCausalLM": Family(qkv_bias=True),
    "Qwen3ForCausalLM": Family(qk_norm=True),
    "MixtralForCausalLM": Family(moe=True),
    "Qwen2MoeForCausalLM": Family(qkv_bias=True, moe=True),
    "Qwen3MoeForCausalLM": Family(qk_norm=True, moe=True),
    "Gemma2ForCausalLM": GEMMA2,
    "Gemma3ForCausalLM": GEMMA3,
    # the text half of a Gemma 3 image-text checkpoint (transformers 4 and 5 nest it differently)
    "Gemma3ForConditionalGeneration": replace(
        GEMMA3,
        prefixes=(("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head.")),
        skipped=("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."),
        defaults=(("vocab_size", 262208), ("num_attention_heads", 8), ("num_key_value_heads", 4), ("head_dim", 256),
                  ("hidden_activation", "gelu_pytorch_tanh"), ("max_position_embeddings", 131072),
                  ("rms_norm_eps", 1e-6), ("rope_theta", 1e6), ("rope_local_base_freq", 10000.0),
                  ("query_pre_attn_scalar", 256), ("sliding_window", 4096), ("sliding_window_pattern", 6),
                  ("tie_word_embeddings", True))),
    "Phi3ForCausalLM": Family(fused_checkpoint=True),
    "GptOssForCausalLM": Family(moe=True, sinks=True, stacked_experts=True,
                                renames=(("router", "gate"), ("sinks", "attn.sinks"))),
}

# activation names in configs (hidden_activation, else hidden_act) -> the gated MLP's activation
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}

# named in errors and the docs: architectures people ask for that this engine does not run yet
NOT_YET = {
    "Qwen3NextForCausalLM": "hybrid linear attention", "Qwen3_5ForCausalLM": "hybrid linear attention",
    "DeepseekV2ForCausalLM": "multi-head latent attention (MLA)",
    "DeepseekV3ForCausalLM": "multi-head latent attention (MLA)",
}
