"""The C decoder stack (kernels/decoder_stack.c) as a declared backend for Llama-family layers
(dense or sparse MLP: a SparseMoE layer hands the stack its moe.c descriptor).

`layer_support` decides once, at start-up, which layers it runs and says why it cannot run the
others (a weight format or KV format without a C kernel, a non-fp32 norm, another attention
backend); the model runs those as modules, so a step may go C, modules, C. It runs the same
kernels in the same order as the modules, so its output is bitwise identical to theirs; it exists
because at small batches the interpreter between ~10 kernel calls per layer costs as much as a
fifth of a decode step.
"""
from __future__ import annotations

import torch
from torch import nn

from ridgeline.kernels import cpu, cpu_stack
from ridgeline.layers.attention import PagedC
from ridgeline.layers.forward_context import get_forward_context
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.moe import SparseMoE
from ridgeline.models.elsewhere import Elsewhere
from ridgeline.models.layer_spec import ACTIVATION_CODES


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _linears(layer: nn.Module) -> list[nn.Module | None]:
    """cpu_stack.LINEARS order; a sparse MLP's linears live in its own descriptor (None here)."""
    sa, mlp = layer.self_attn, layer.mlp
    if isinstance(mlp, SparseMoE):
        return [sa.qkv_proj, sa.o_proj, None, None]
    return [sa.qkv_proj, sa.o_proj, mlp.gate_up_proj, mlp.down_proj]


def _why_not(layer: nn.Module) -> str | None:
    if isinstance(layer.mlp, SparseMoE) and isinstance(layer.mlp.c_descriptor(), str):
        return layer.mlp.c_descriptor()
    sa = layer.self_attn
    if sa.q_norm is not None and (sa.q_norm.weight.dtype != torch.float32 or sa.k_norm.weight.dtype != torch.float32):
        return "q/k norm weights are not fp32"
    for lin in filter(None, _linears(layer)):
        desc = lin.format.stack_weight(lin)
        if isinstance(desc, str):
            return f"{lin.prefix}: {desc}"
        if not cpu_stack.runs_weight_format(desc[0]):
            return f"{lin.prefix}: the C stack has no kernel for weight format {lin.format.name} on this CPU"
        if lin.bias is not None and (lin.bias.dtype != torch.float32 or not lin.bias.is_contiguous()):
            return f"{lin.prefix}: bias is not fp32"
    for norm in filter(None, (layer.input_layernorm, layer.post_attention_layernorm, layer.attn_out_norm,
                              layer.mlp_out_norm)):
        if norm.weight.dtype != torch.float32 or not norm.weight.is_contiguous():
            return "norm weights are not fp32"
    attn = layer.self_attn.attn
    if not isinstance(attn.backend, PagedC):
        return f"attention backend {attn.backend.name} (the C stack reads the cache with the paged C kernel)"
    if not cpu_stack.runs_kv_format(attn.kv.c_format):
        return f"the C stack cannot read {attn.kv.formats} KV caches"
    return None


class CStack:
    """Descriptors of one model's layers, gathered once; valid while the model lives (it holds this
    object and every tensor the descriptors point into)."""

    @staticmethod
    def layer_support(model: nn.Module, plan: KernelPlan) -> list[str | None]:
        """Per layer: None if the C stack runs it, else why not."""
        if not plan.c_stack or cpu.lib() is None:
            why = "the kernel plan has no C decoder stack on this machine (it needs the fused fp32 C " \
                  "element-wise kernels and the C matmul)"
            return [why] * len(model.layers)
        cpu_stack.check_layout()
        if model.norm is not None and model.norm.weight.dtype != torch.float32:
            return ["the final norm is not fp32"] * len(model.layers)
        return [("on another pipeline stage" if isinstance(layer, Elsewhere) else _why_not(layer))
                for layer in model.layers]

    def __init__(self, model: nn.Module):
        layers = model.layers
        held = model.held_layers
        a0 = held[0].self_attn
        reasons = self.layer_support(model, model.plan)
        dense = [layer.mlp.down_proj.in_features for layer in held if not isinstance(layer.mlp, SparseMoE)]
        self.dims = torch.tensor([len(layers), held[0].input_layernorm.weight.shape[0], a0.h, a0.hkv, a0.d,
                                  max(dense, default=0), a0.attn.kv.k.shape[1]], dtype=torch.int64)
        self.moe = next((layer.mlp for layer, why in zip(layers, reasons)
                         if why is None and isinstance(layer.mlp, SparseMoE)), None)  # sizes the MoE scratch
        self.softcaps: list[torch.Tensor] = []  # the soft-caps the descriptors point at (one fp32 each)
        rows = []
        for layer, why in zip(layers, reasons):
            if why is not None:  # run as modules: never read
                rows.append([0] * (len(cpu_stack.LAYER_FIELDS) + 4 * len(cpu_stack.LINEARS)))
                continue
            sa, attn = layer.self_attn, layer.self_attn.attn
            moe = layer.mlp.c_descriptor() if isinstance(layer.mlp, SparseMoE) else None
            row = [_ptr(layer.input_layernorm.weight), _ptr(layer.post_attention_layernorm.weight), attn.window or 0,
                   attn.kv.c_format, _ptr(attn.kv.k), _ptr(attn.kv.v), _ptr(attn.kv.k_scale), _ptr(attn.kv.v_scale),
                   _ptr(sa.q_norm.weight if sa.q_norm is not None else None),
                   _ptr(sa.k_norm.weight if sa.k_norm is not None else None), _ptr(moe), _ptr(attn.kv.k_centers),
                   _ptr(layer.attn_out_norm.weight if layer.attn_out_norm is not None else None),
                   _ptr(layer.mlp_out_norm.weight if layer.mlp_out_norm is not None else None),
                   ACTIVATION_CODES[layer.spec.activation], _ptr(sa.rotary.cos_sin), _ptr(self._softcap(attn.softcap)),
                   _ptr(attn.sinks), 0 if moe is not None else _ptr(layer.mlp.act_params), attn.kv.kv_group]
            for lin in _linears(layer):
                if lin is None:
                    row += [0] * len(cpu_stack.WEIGHT_FIELDS)
                    continue
                fmt, data, scale = lin.format.stack_weight(lin)
                row += [fmt, data, scale, _ptr(lin.bias)]
            rows.append(row)
        self.layer_ptrs = torch.tensor(rows, dtype=torch.int64)
        self.eps, self.scale = held[0].input_layernorm.eps, a0.attn.scale
        self.cos_sin = a0.rotary.cos_sin
        self.final_norm = model.norm.weight if model.norm is not None else None  # None: not the last stage
        self.num_layers = len(layers)
        self.scratch = torch.empty(0)  # grown to the largest step seen, then reused

    def _softcap(self, cap: float | None) -> torch.Tensor | None:
        if cap is None:
            return None
        self.softcaps.append(torch.tensor([cap], dtype=torch.float32))
        return self.softcaps[-1]

    def __call__(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, first: int,
                 last: int, final_norm: bool, hook=None, capture: list[int] | None = None,
                 captured: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layers [first, last) on (hidden, residual) fp32 [T, hidden] (residual None: hidden is the
        embeddings, which become the residual stream). Returns (normed hidden, None) with
        final_norm, else (last MLP output, residual)."""
        ctx = get_forward_context()
        # [KV groups, attention groups, GP_FIELDS] and slots [KV groups, T]: a layer reads its KV group's
        views = [ctx.for_kv_group(k) for k in range(1 + len(ctx.kv_groups))]
        groups = torch.tensor([[[g.rows.start, g.rows.stop - g.rows.start, g.block_tables.data_ptr(),
                                 g.block_tables.shape[1], _ptr(g.row_seq),
                                 (g.key_lens if g.row_seq is None else g.row_key_lens).data_ptr(), _ptr(g.tile_len)]
                                for g in view] for _, view in views], dtype=torch.int64)
        slots = ctx.slot_mapping if len(views) == 1 else torch.stack([s for s, _ in views])
        T = hidden.shape[0]
        if residual is None:
            x, out = hidden.contiguous(), torch.empty_like(hidden)
        else:
            x, out = residual.contiguous(), hidden.contiguous()
        need = cpu_stack.scratch_floats(self.dims, T)
        if self.scratch.numel() < need:
            self.scratch = torch.empty(need)
        cap = None
        if capture:
            cap = torch.zeros(self.num_layers, dtype=torch.int64)
            for layer in capture:
                if first <= layer < last:
                    captured[layer] = torch.empty_like(x)
                    cap[layer] = captured[layer].data_ptr()
        c_hook = cpu_stack.make_hook(hook) if hook is not None else None
        moe_scratch = self.moe.scratch_for(T, x.shape[1]) if self.moe is not None else None
        cpu_stack.run(self.dims, self.eps, self.scale, self.layer_ptrs, first, last, self.cos_sin,
                      self.final_norm if final_norm else None, x, out, residual is not None, positions,
                      slots, groups, cap, c_hook, self.scratch, moe_scratch, ctx.c_delta)
        return (out, None) if final_norm else (out, x)
