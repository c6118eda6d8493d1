"""The decoder stack of a Llama-family model in one C call per step (kernels/decoder_stack.c).

It runs the same kernels the modules call one at a time, in the same order, so its output is
bitwise identical to theirs; it exists because at small batches the interpreter between ~10
kernel calls per layer costs as much as a fifth of a decode step.
"""
from __future__ import annotations

import torch
from torch import nn

from ridgeline.kernels import cpu
from ridgeline.runner.forward_context import ForwardContext


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class DecoderStack:
    """Pointers to one model's weights and KV caches, gathered once; call it once per step. Valid while
    the model lives: the model holds this object (Model.stack) and every tensor it points into."""

    def __init__(self, model: nn.Module):
        lib = cpu.lib()
        layers = model.layers
        a0 = layers[0].self_attn
        packed = [lin.packed for layer in layers for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                              layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        self.dims = torch.tensor([len(layers), model.norm.weight.shape[0], a0.h, a0.hkv, a0.d,
                                  layers[0].mlp.down_proj.in_features, a0.attn.k_cache.shape[1], a0.attn.window or 0,
                                  int(packed[0].dtype == torch.bfloat16),
                                  int(a0.attn.k_cache.dtype == torch.bfloat16)], dtype=torch.int64)
        rows = []
        for layer in layers:
            sa, mlp = layer.self_attn, layer.mlp
            rows.append([_ptr(layer.input_layernorm.weight), _ptr(sa.qkv_proj.packed.data), _ptr(sa.qkv_proj.bias),
                         _ptr(sa.o_proj.packed.data), _ptr(sa.o_proj.bias), _ptr(layer.post_attention_layernorm.weight),
                         _ptr(mlp.gate_up_proj.packed.data), _ptr(mlp.down_proj.packed.data),
                         _ptr(sa.attn.k_cache), _ptr(sa.attn.v_cache)])
        assert len(rows[0]) == lib.ridgeline_stack_fields(0)
        self.layer_ptrs = torch.tensor(rows, dtype=torch.int64)
        self.eps, self.scale = layers[0].input_layernorm.eps, a0.attn.scale
        self.cos_sin, self.final_norm = a0.rotary.cos_sin, model.norm.weight
        self.scratch = torch.empty(0)  # grown to the largest step seen, then reused

    @staticmethod
    def supported(model: nn.Module) -> bool:
        """Everything the C stack assumes: packed weights of one dtype, fp32 norms and biases, fused
        element-wise kernels, the paged C attention over an fp32 or bf16 CPU cache."""
        from ridgeline.layers import attention, kernels
        if not (kernels.FUSED_OPS and attention.PREFILL_IN_C and cpu.lib() is not None):
            return False
        dtypes = set()
        for layer in model.layers:
            sa, mlp = layer.self_attn, layer.mlp
            lins = (sa.qkv_proj, sa.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if any(lin.packed is None for lin in lins):
                return False
            dtypes |= {lin.packed.dtype for lin in lins}
            tensors = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                       *(b for b in (sa.qkv_proj.bias, sa.o_proj.bias) if b is not None)]
            if any(t.dtype != torch.float32 or not t.is_contiguous() for t in tensors):
                return False
            cache = sa.attn.k_cache
            if (sa.attn.backend is not attention.BACKENDS["auto"] or cache.device.type != "cpu"
                    or cache.dtype not in (torch.float32, torch.bfloat16) or not cache.is_contiguous()
                    or not sa.attn.v_cache.is_contiguous()):
                return False
        return len(dtypes) == 1 and model.norm.weight.dtype == torch.float32

    def serves(self, x: torch.Tensor, ctx: ForwardContext) -> bool:
        return (x.dtype == torch.float32 and x.is_contiguous()
                and all(g.q_index.shape[1] == 1 or g.row_seq is not None for g in ctx.groups))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x [T, hidden] fp32 embeddings (becomes the residual stream) -> final normed hidden [T, hidden]."""
        groups = torch.tensor([[g.rows.start, g.rows.stop - g.rows.start, g.block_tables.data_ptr(),
                                g.block_tables.shape[1], _ptr(g.row_seq),
                                (g.key_lens if g.row_seq is None else g.row_key_lens).data_ptr()]
                               for g in ctx.groups], dtype=torch.int64)
        out = torch.empty_like(x)
        lib = cpu.lib()
        need = lib.ridgeline_stack_scratch(self.dims.data_ptr(), x.shape[0])
        if self.scratch.numel() < need:
            self.scratch = torch.empty(need)
        rc = lib.ridgeline_decoder_stack(
            self.dims.data_ptr(), self.eps, self.scale, self.layer_ptrs.data_ptr(), self.cos_sin.data_ptr(),
            self.final_norm.data_ptr(), x.data_ptr(), out.data_ptr(), x.shape[0], positions.data_ptr(),
            ctx.slot_mapping.data_ptr(), groups.data_ptr(), len(ctx.groups), self.scratch.data_ptr(),
            torch.get_num_threads())
        if rc:
            raise RuntimeError(f"decoder stack failed ({rc})")
        return out
