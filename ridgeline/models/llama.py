"""The decoder of every supported architecture (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3, Gemma 2,
Gemma 3, Phi-3/4; Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-OSS): one class built from each layer's declaration
(models/layer_spec.py: norms and their placement, activation, q/k norms, rotary table, window,
soft-caps, attention sinks, sparse MLP) and the model's (embedding scale, final soft-cap, tied head).

Layer ranges: `run_layers(positions, hidden, residual, start, end)` runs layers [start, end) and
returns (hidden, residual) before the final norm (a pipeline stage hands those on) or, with
final_norm, the normed hidden state. Hooks: hook(layer, where, x) is called in place on each
layer's attention output (where 0) and MLP output (where 1), after the bias (tensor parallelism
all-reduces there). capture: layers whose output hidden state (residual + MLP output) to return.
A pipeline stage (opts.stage) builds only its layers: the others are `Elsewhere` placeholders (no
weights, never run), the embedding only on the first stage, final norm and LM head on the last.
Where the C decoder stack runs a layer, it runs these same steps (models/decoder_stack.py).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_ops, cpu_stack
from ridgeline.layers.attention import Attention
from ridgeline.layers.forward_context import current_delta, get_forward_context
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.kv_cache import LayerKV
from ridgeline.layers.linear import Linear
from ridgeline.layers.mlp import MLP
from ridgeline.layers.moe import SparseMoE
from ridgeline.layers.norm import RMSNorm
from ridgeline.layers.rotary import Rotary, interleave_rows
from ridgeline.models.elsewhere import Elsewhere
from ridgeline.models.layer_spec import LayerSpec, layer_specs
from ridgeline.layers.build_options import BuildOptions
from ridgeline.weights.hf_config import ArchConfig

Hook = Callable[[int, int, torch.Tensor], None]
ATTN_OUT, MLP_OUT = 0, 1


class SelfAttention(nn.Module):
    def __init__(self, cfg: ArchConfig, rotary: Rotary, opts: BuildOptions, prefix: str, spec: LayerSpec):
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        sizes = [self.h * self.d, self.hkv * self.d, self.hkv * self.d]
        self.qkv_proj = Linear(cfg.hidden_size, sum(sizes), opts.format_for(f"{prefix}.qkv_proj"), cfg.qkv_bias,
                               opts.act_dtype, sizes, f"{prefix}.qkv_proj")
        self.o_proj = Linear(self.h * self.d, cfg.hidden_size, opts.format_for(f"{prefix}.o_proj"), cfg.o_bias,
                             opts.act_dtype, prefix=f"{prefix}.o_proj")
        self.rotary = rotary
        self.attn = Attention(self.h, self.hkv, self.d, opts.attention_backend, spec.window, cfg.query_scale,
                              spec.attn_softcap, spec.sinks)
        self.fused = opts.plan.fused_ops
        self.q_norm = self.k_norm = None  # per-head RMSNorm [D] of q and k before rotary (Qwen3, Gemma 3)
        if spec.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps, opts.act_dtype)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps, opts.act_dtype)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        kv = self.attn.kv
        if self.fused and kv.c_format is not None and qkv.dtype == torch.float32 and qkv.is_contiguous():
            if self.q_norm is not None:
                self._qk_norm_fused(qkv)
            kv.write_rope(qkv, positions, self.rotary.cos_sin, get_forward_context().for_kv_group(kv.kv_group)[0],
                          self.h, self.hkv, self.d)
            return self.o_proj(self.attn.attend(qkv[:, :self.h * self.d].view(T, self.h, self.d)))
        q, k, v = qkv.split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q, k = q.view(T, self.h, self.d), k.view(T, self.hkv, self.d)
        if self.q_norm is not None:
            q = F.rms_norm(q, (self.d,), self.q_norm.weight, self.q_norm.eps)
            k = F.rms_norm(k, (self.d,), self.k_norm.weight, self.k_norm.eps)
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v.view(T, self.hkv, self.d)))

    def _qk_norm_fused(self, qkv: torch.Tensor) -> None:
        if self.q_norm.weight.dtype == torch.float32:
            cpu_ops.qk_norm(qkv, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, self.h, self.hkv, self.d)
            return
        q, k = qkv[:, :self.h * self.d], qkv[:, self.h * self.d:(self.h + self.hkv) * self.d]
        q.copy_(F.rms_norm(q.view(-1, self.h, self.d), (self.d,), self.q_norm.weight, self.q_norm.eps).flatten(1))
        k.copy_(F.rms_norm(k.view(-1, self.hkv, self.d), (self.d,), self.k_norm.weight, self.k_norm.eps).flatten(1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig, rotary: Rotary, opts: BuildOptions, spec: LayerSpec):
        super().__init__()
        index = spec.index
        prefix = f"model.layers.{index}"
        self.index, self.spec = index, spec

        def norm():
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts.act_dtype, opts.plan.fused_ops)
        self.input_layernorm = norm()
        self.self_attn = SelfAttention(cfg, rotary, opts, f"{prefix}.self_attn", spec)
        self.post_attention_layernorm = norm()  # before the MLP (Gemma's pre_feedforward_layernorm)
        # sandwich norms (Gemma 2/3): on the attention and the MLP output, before each is added to the residual
        self.attn_out_norm = norm() if spec.sandwich else None
        self.mlp_out_norm = norm() if spec.sandwich else None
        if spec.sparse:
            self.mlp = SparseMoE(cfg.hidden_size, cfg.moe, opts, f"{prefix}.mlp", index)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, opts, f"{prefix}.mlp", spec.activation)

    def forward(self, positions, x, residual, hook: Hook | None = None):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        if hook is not None:
            hook(self.index, ATTN_OUT, x)
        if self.attn_out_norm is not None:
            x = self.attn_out_norm(x)
        x, residual = self.post_attention_layernorm(x, residual)
        x = self.mlp(x)
        if hook is not None:
            hook(self.index, MLP_OUT, x)
        if self.mlp_out_norm is not None:
            x = self.mlp_out_norm(x)
        return x, residual


class Model(nn.Module):
    def __init__(self, cfg: ArchConfig, max_positions: int, opts: BuildOptions):
        super().__init__()
        specs = layer_specs(cfg)
        rotaries = {}  # one table per distinct (theta, scaling): Gemma 3's local and global layers differ
        for spec in specs:
            if spec.rope not in rotaries:
                theta, scaling = spec.rope
                rotaries[spec.rope] = Rotary(cfg.head_dim, max_positions, theta, dict(scaling) if scaling else None,
                                             cfg.rotary_dim)
        # Gemma's sqrt(hidden), rounded to the activations' dtype as transformers rounds it (None: no scale)
        self.embed_scale = None if cfg.embed_scale is None else \
            torch.tensor(cfg.embed_scale, dtype=opts.act_dtype, device="cpu").item()
        st = self.stage = opts.stage
        self.embed_tokens = None  # a middle stage, or the last one with an untied head
        if st is None or st.first or (st.last and cfg.tie_word_embeddings):  # a tied head is the table
            # an uninitialized table (the checkpoint fills it; a missing tensor is a load error): the random
            # init nn.Embedding would run costs seconds on large vocabularies (3.3 s at 128k x 4096)
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                             _weight=torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=opts.dtype))
            self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, rotaries[s.rope], opts, s) if st is None or st.holds(s.index)
                                    else Elsewhere(s.index) for s in specs)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, opts.act_dtype, opts.plan.fused_ops) \
            if st is None or st.last else None
        self.act_dtype = opts.act_dtype
        self.plan = opts.plan
        self.tp = opts.tp  # TPComm: vocab-parallel embedding, all-reduce after each row-parallel projection
        self.stack = None  # models.decoder_stack.CStack once the KV cache is bound, where the plan has it
        self.segments: list[tuple[int, int, bool]] = [(0, cfg.num_layers, False)]  # (start, end, in C)
        self.c_embed = False  # the lookup through kernels/ops.c (bind_kv decides, once the weights are in)

    @property
    def held_layers(self) -> list[DecoderLayer]:
        """The layers this process holds (all of them, or a pipeline stage's range)."""
        return [layer for layer in self.layers if not isinstance(layer, Elsewhere)]

    def bind_kv(self, kvs: list[LayerKV]) -> list[str | None]:
        """Bind each held layer's KV cache (kvs: one per held layer) and choose each layer's path: None
        where the C stack runs it, else the reason it runs as modules. Decided here, once; printed at
        start-up. Returns the held layers' paths."""
        from ridgeline.models.decoder_stack import CStack
        for layer, kv in zip(self.held_layers, kvs):
            layer.self_attn.attn.bind(kv, self.plan)
        reasons = CStack.layer_support(self, self.plan)
        self.stack = CStack(self) if any(r is None for r in reasons) else None
        w = self.embed_tokens.weight if self.embed_tokens is not None else None
        self.c_embed = (self.plan.fused_ops and self.tp is None and self.act_dtype == torch.float32 and w is not None
                        and w.device.type == "cpu" and w.is_contiguous() and w.dtype in cpu_ops.EMBED_FORMATS)
        self.segments = []
        for i, r in enumerate(reasons):
            in_c = r is None
            if self.segments and self.segments[-1][2] == in_c:
                self.segments[-1] = (self.segments[-1][0], i + 1, in_c)
            else:
                self.segments.append((i, i + 1, in_c))
        return [r for layer, r in zip(self.layers, reasons) if not isinstance(layer, Elsewhere)]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp is not None:
            x = self.tp.embed(self.embed_tokens, input_ids, self.act_dtype)
        elif self.c_embed and input_ids.dim() == 1:
            x = cpu_ops.embed(self.embed_tokens.weight, input_ids)
        else:
            x = self.embed_tokens(input_ids).to(self.act_dtype)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        return x

    def _reducing(self, hook: Hook | None) -> Hook | None:
        """With tensor parallelism the all-reduce runs first; a caller's hook then sees full outputs."""
        if self.tp is None:
            return hook
        if hook is None:
            return self.tp.hook

        def both(layer: int, where: int, x: torch.Tensor) -> None:
            self.tp.hook(layer, where, x)
            hook(layer, where, x)
        return both

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> final normed hidden states [T, hidden]."""
        return self.run_layers(positions, self.embed(input_ids), None, 0, len(self.layers), final_norm=True)[0]

    def run_layers(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, start: int,
                   end: int, final_norm: bool = False, hook: Hook | None = None,
                   capture: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
        """Layers [start, end) from (hidden, residual) (residual None: hidden is the embeddings).
        Returns (hidden, residual, captured) or, with final_norm, (normed hidden, None, captured)."""
        captured: dict[int, torch.Tensor] = {}
        hook = self._reducing(hook)
        # per-row additions (LoRA) the C stack is not given run in the modules' Linears
        modules_only = current_delta() is not None and get_forward_context().c_delta is None
        for s, e, in_c in self.segments:
            s, e = max(s, start), min(e, end)
            if s >= e:
                continue
            if in_c and not modules_only:
                hidden, residual = self.stack(positions, hidden, residual, s, e, final_norm and e == end, hook,
                                              capture, captured)
                if final_norm and e == end:
                    return hidden, None, captured
                continue
            for layer in self.layers[s:e]:
                hidden, residual = layer(positions, hidden, residual, hook)
                if capture and layer.index in capture:
                    captured[layer.index] = hidden + residual
        if final_norm:
            return (self.norm(hidden) if residual is None else self.norm(hidden, residual)[0]), None, captured
        return hidden, residual, captured


GREEDY_KEPT_ROWS = 16  # greedy_tokens keeps its buffers for steps of at most this many rows


def _mask_rows(masks: list[bytes | None] | None, M: int, V: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """greedy_tokens' masks as linear_argmax takes them: the masks given [R, ceil(V / 32)] int32 and
    each row's index among them [M] int64 (-1: unmasked); (None, None) without any."""
    if masks is None or all(m is None for m in masks):
        return None, None
    if len(masks) != M:
        raise ValueError(f"{len(masks)} masks for {M} rows")
    given = [m for m in masks if m is not None]
    words = (V + 31) // 32
    buf = bytearray(b"".join(given))
    if len(buf) != 4 * words * len(given):
        raise ValueError(f"a structured-output mask is not {4 * words} bytes")
    mask_of, r = [], 0
    for m in masks:
        mask_of.append(-1 if m is None else r)
        r += m is not None
    return torch.frombuffer(buf, dtype=torch.int32).view(len(given), words), torch.tensor(mask_of, dtype=torch.int64)


class LlamaForCausalLM(nn.Module):
    # HF checkpoint name -> (our parameter, shard index) for the fused projections (w1/w3/w2: Mixtral's experts)
    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
              "w1": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1), "w2": ("down_proj", None)}
    renames = {"block_sparse_moe": "mlp"}  # Mixtral's sparse MLP is our layer's `mlp`

    def __init__(self, cfg: ArchConfig, max_positions: int, opts: BuildOptions):
        super().__init__()
        self.cfg = cfg
        self.renames = {**type(self).renames, **dict(cfg.family.renames)}  # the family's module names onto ours
        self.model = Model(cfg, max_positions, opts)
        self.slice_tensor = None  # tensor parallelism: distributed.shard.Slicer, set by the engine
        self.lm_head = None  # a pipeline stage before the last
        if opts.stage is None or opts.stage.last:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, opts.format_for("lm_head"), prefix="lm_head")
        if self.ties_head:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._greedy_desc: torch.Tensor | None = None  # greedy_tokens' head descriptor, once decided
        self._greedy_bufs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # rows -> (logits, ids) scratch
        # greedy_tokens on a step whose rows are all masked computes only the head's column groups holding an
        # allowed token (the same tokens either way); False: the whole head (to measure what that saves)
        self.masked_head = True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    @property
    def ties_head(self) -> bool:
        """The LM head's weight is the embedding table itself (a quantized head keeps its own copy)."""
        return self.cfg.tie_word_embeddings and self.lm_head is not None and self.lm_head.format.shares_tied_weight

    @property
    def plan(self) -> KernelPlan:
        return self.model.plan

    def transform_weight(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Checkpoint tensor -> our layout: q/k rows (and the q/k norm weights) to interleaved rotary pairs;
        a (1 + w) norm's weights (Gemma) to 1 + w in float32, what the norm multiplies by."""
        if any(p in name for p in (".q_proj.", ".k_proj.", ".q_norm.", ".k_norm.")) and not name.endswith(".g_idx"):
            tensor = interleave_rows(tensor, self.cfg.head_dim, self.cfg.rotary_dim)
        if self.cfg.norm_offset and name.endswith("norm.weight"):
            tensor = tensor.float() + 1.0
        return tensor

    def greedy_tokens(self, hidden: torch.Tensor, masks: list[bytes | None] | None = None) -> list[int] | None:
        """hidden [S, hidden] fp32 -> each row's argmax of compute_logits(hidden), from one C call that runs
        the LM head's own kernel and picks as torch.argmax does; None where the head has no such kernel
        (tensor parallelism, a module-path format, another device): then compute_logits and the sampler.
        masks: per row, None or an allowed-token bitmask (structured outputs, ceil(V / 32) little-endian
        int32 words): that row's argmax is over the tokens it allows, the token torch.argmax picks on the
        logits with every forbidden one set to -inf, read from the bits without building that row."""
        desc = self._greedy_head()
        if desc is None or hidden.dtype != torch.float32 or hidden.device.type != "cpu" or self.cfg.final_softcap:
            return None  # a soft-capped head: its ties are the capped logits', which the C argmax does not see
        M = hidden.shape[0]
        bufs = self._greedy_bufs.get(M)
        if bufs is None:
            bufs = (torch.empty(M, self.lm_head.out_features), torch.empty(M, dtype=torch.int64))
            if M <= GREEDY_KEPT_ROWS:  # a small step's logits and choices, kept for the next one of its size
                self._greedy_bufs[M] = bufs
        cpu_stack.linear_argmax(desc, hidden.contiguous(), *bufs, *_mask_rows(masks, M, bufs[0].shape[1]),
                                full=not self.masked_head)
        return bufs[1].tolist()

    def _greedy_head(self) -> torch.Tensor | None:
        """The LM head's weight descriptor for kernels/stack_linear.c, decided once (the weights are final
        by the first step); None where it cannot run there."""
        if self._greedy_desc is not None:
            return self._greedy_desc if self._greedy_desc.numel() else None
        head, desc = self.lm_head, torch.empty(0, dtype=torch.int64)
        if head is not None and self.model.tp is None and self.plan.fused_ops and cpu_ops.available():
            w = head.format.stack_weight(head)
            if not isinstance(w, str) and cpu_stack.runs_weight_format(w[0]) and (
                    head.bias is None or (head.bias.dtype == torch.float32 and head.bias.is_contiguous())):
                desc = torch.tensor([*w, 0 if head.bias is None else head.bias.data_ptr()], dtype=torch.int64)
        self._greedy_desc = desc
        return desc if desc.numel() else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden] (only the rows that need logits) -> logits [S, V] float32."""
        if self.model.tp is not None:  # vocab-parallel head: each rank's chunk, gathered
            logits = self.model.tp.gather_logits(self.lm_head(hidden).float())
        else:
            logits = self.lm_head(hidden).float()
        cap = self.cfg.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
