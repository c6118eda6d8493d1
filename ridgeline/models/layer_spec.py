"""Each decoder layer's structure, declared once from the config (weights/families.py + hf_config):
the module path (models/llama.py) builds its modules from it and the C decoder stack
(models/decoder_stack.py) sets its descriptor switches from it, so the two cannot disagree.

One layer, as both paths run it (fp32 activations):
    h = norm_in(x)                        # x: the residual stream; norms are RMSNorm, (1 + w) folded at load
    h = o(attn(rope(qk_norm?(qkv(h)))))   # scores * scale, soft-capped where declared, window where declared,
                                          # a sink logit per head in the softmax where declared (GPT-OSS)
    h = attn_out_norm?(h)                 # sandwich norms (Gemma 2/3)
    x = x + h; h = norm_mid(x)
    h = down(act(gate(h)) * up(h))        # act: silu | gelu_tanh; or the sparse MLP (its experts' act:
                                          # silu | swiglu_clamp, biases where the model has them)
    h = mlp_out_norm?(h); x = x + h
"""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.weights.hf_config import ArchConfig

ACTIVATION_CODES = {"silu": 0, "gelu_tanh": 1, "swiglu_clamp": 2}  # the C stack's activation switch (LP_ACT)


@dataclass(frozen=True)
class LayerSpec:
    index: int
    window: int | None  # keys a query reaches (None: all)
    rope: tuple  # (theta, frozen scaling): the rotary table this layer reads
    qk_norm: bool
    sandwich: bool  # attn_out_norm and mlp_out_norm exist
    activation: str
    sparse: bool  # the MLP is the MoE one
    attn_softcap: float | None
    sinks: bool  # the attention has a learned sink logit per query head


def layer_specs(cfg: ArchConfig) -> list[LayerSpec]:
    specs = []
    for i in range(cfg.num_layers):
        window = cfg.window_of(i)
        rope = cfg.local_rope if window is not None and cfg.local_rope is not None else (cfg.rope_theta,
                                                                                          cfg.rope_scaling)
        specs.append(LayerSpec(i, window, rope, cfg.qk_norm, cfg.sandwich_norms, cfg.activation,
                               cfg.moe is not None and i in cfg.moe.sparse_layers, cfg.attn_softcap, cfg.sinks))
    return specs
