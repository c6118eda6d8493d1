"""ctypes binding of kernels/decoder_stack.c: layers [first, last) of a Llama-family decoder in one
call, driven by descriptor arrays (see the C file for their layout). This module only moves
pointers; ridgeline/models/decoder_stack.py builds the descriptors from a model's modules."""
from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from ridgeline.kernels import cpu

# hook(layer, where, x pointer, T, hidden) -> 0, or non-zero to abort the step; where: 0 attention
# output, 1 MLP output (after the bias), modified in place
HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
WEIGHT_FIELDS = ("format", "data", "scale", "bias")
LINEARS = ("qkv", "o", "gate_up", "down")
LAYER_FIELDS = ("in_norm", "post_norm", "window", "kv_format", "k_cache", "v_cache", "k_scale", "v_scale", "q_norm",
                "k_norm", "moe", "k_centers", "attn_out_norm", "mlp_out_norm", "activation", "cos_sin",
                "softcap", "sinks", "act_params", "kv_group")
GROUP_FIELDS = ("row0", "rows", "tables", "max_nb", "row_seq", "key_lens", "tile_len")


def check_layout() -> None:
    """The C side's field counts agree with the names above (a mismatch is a build bug)."""
    lib = cpu.lib()
    want = (len(LAYER_FIELDS) + len(LINEARS) * len(WEIGHT_FIELDS), len(GROUP_FIELDS), len(WEIGHT_FIELDS),
            len(LAYER_FIELDS))
    got = tuple(lib.ridgeline_stack_fields(i) for i in range(4))
    if got != want:
        raise RuntimeError(f"decoder_stack.c layout {got} != {want}")


def runs_weight_format(code: int) -> bool:
    return bool(cpu.lib().ridgeline_stack_weight_format(code))


def runs_kv_format(code: int) -> bool:
    return bool(cpu.lib().ridgeline_stack_kv_format(code))


def scratch_floats(dims: torch.Tensor, T: int) -> int:
    return cpu.lib().ridgeline_stack_scratch(dims.data_ptr(), T)


def make_hook(fn: Callable[[int, int, torch.Tensor], None]):
    """A C hook that calls fn(layer, where, x [T, hidden] fp32 view) in place; keep the result alive."""
    def call(layer, where, ptr, T, H):
        try:
            x = torch.frombuffer((ctypes.c_float * (T * H)).from_address(ptr), dtype=torch.float32).view(T, H)
            fn(layer, where, x)
            return 0
        except Exception:  # never unwind through C; the step fails with a clear error instead
            import logging
            logging.getLogger(__name__).exception("decoder stack hook failed")
            return -3
    return HOOK(call)


def run(dims: torch.Tensor, eps: float, scale: float, layers: torch.Tensor, first: int, last: int,
        cos_sin: torch.Tensor, final_norm: torch.Tensor | None, x: torch.Tensor, out: torch.Tensor, hidden_in: bool,
        positions: torch.Tensor, slots: torch.Tensor, groups: torch.Tensor, capture: torch.Tensor | None,
        # slots [KV groups, T] (or [T]: one), groups [KV groups, attention groups, GROUP_FIELDS]
        hook, scratch: torch.Tensor, moe_scratch: torch.Tensor | None = None, lora: torch.Tensor | None = None) -> None:
    """lora: None, or [row slots pointer, tables pointer] (kernels/lora_add.c, decoder_stack.c)."""
    from ridgeline.kernels.cpu_moe import ROUTE_CALLBACK
    rc = cpu.lib().ridgeline_decoder_stack(
        dims.data_ptr(), eps, scale, layers.data_ptr(), first, last, cos_sin.data_ptr(),
        None if final_norm is None else final_norm.data_ptr(), x.data_ptr(), out.data_ptr(), int(hidden_in),
        x.shape[0], positions.data_ptr(), slots.data_ptr(), groups.data_ptr(), groups.shape[1],
        None if capture is None else capture.data_ptr(),
        None if hook is None else ctypes.cast(hook, ctypes.c_void_p), scratch.data_ptr(),
        None if moe_scratch is None else moe_scratch.data_ptr(), ctypes.cast(ROUTE_CALLBACK, ctypes.c_void_p),
        None if lora is None else lora.data_ptr(), torch.get_num_threads())
    if rc:
        raise RuntimeError(f"decoder stack failed ({rc}) in layers [{first}, {last})")


def linear_argmax(desc: torch.Tensor, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor,
                  masks: torch.Tensor | None = None, mask_of: torch.Tensor | None = None, full: bool = False) -> None:
    """x [M, K] fp32 contiguous -> y [M, N] = x W^T (desc: a weight descriptor, WEIGHT_FIELDS) and
    ids [M] int64: each row's argmax as torch.argmax picks it (first on ties, a NaN wins). masks
    [R, ceil(N / 32)] int32 allowed-token bitmasks and mask_of [M] int64 (a row of masks, or -1): row m's
    argmax is that of its logits with every token its mask forbids set to -inf. When every row has a mask,
    y holds the logits of the column groups holding an allowed token (bitwise the full head's: every
    allowed token's among them) and only those are computed (full: all of them anyway, the same ids);
    otherwise all of y."""
    M, K = x.shape
    if masks is not None:
        assert masks.dtype == torch.int32 and masks.is_contiguous() and masks.shape[1] == (y.shape[1] + 31) // 32
        assert mask_of.dtype == torch.int64 and mask_of.shape == (M,) and int(mask_of.max()) < masks.shape[0]
    rc = cpu.lib().ridgeline_linear_argmax(desc.data_ptr(), x.data_ptr(), y.data_ptr(), M, y.shape[1], K,
                                           ids.data_ptr(), None if masks is None else masks.data_ptr(),
                                           None if masks is None else mask_of.data_ptr(), int(full),
                                           torch.get_num_threads())
    if rc:
        raise RuntimeError(f"greedy LM head failed ({rc}): M={M} N={y.shape[1]} K={K}")
