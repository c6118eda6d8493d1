"""ctypes binding of kernels/moe.c: a sparse MLP's routing and grouped expert matmuls in one call.
The module path (layers/moe.py) and the C decoder stack call the same function on the same
descriptor, so their outputs are bitwise equal. Expert parallelism (distributed/expert_dispatch.py)
calls the pieces (route, experts, combine, shared) with the token exchange between them, and puts
a DISPATCH callback in the descriptor so that the decoder stack hands it the whole layer."""
from __future__ import annotations

import ctypes
import logging

import torch

from ridgeline.kernels import cpu

# route(layer, probs [T, E] fp32, T, E, k, idx [T, k] int64 out) -> 0; called by moe.c only when a
# token's k-th largest probability ties with an expert outside its top k
ROUTE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_int64, ctypes.c_void_p)
# header fields of a descriptor (moe.c MD_*), then two weight descriptors (gate_up, down) per expert
HEADER = ("experts", "top_k", "inter", "norm_topk", "shared_inter", "counts", "dispatch", "act", "act_params")
WEIGHTS = ("router", "shared_gate_up", "shared_down", "shared_gate")
WEIGHT_FIELDS = 4
# dispatch(layer, x pointer, out pointer, T, H) -> 0, or non-zero to abort the step
DISPATCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_int64)


def _route(layer, probs_ptr, T, E, k, idx_ptr) -> int:
    """Ties resolved by torch.topk on the same probabilities: the experts transformers would choose."""
    try:
        probs = torch.frombuffer((ctypes.c_float * (T * E)).from_address(probs_ptr), dtype=torch.float32)
        idx = torch.frombuffer((ctypes.c_int64 * (T * k)).from_address(idx_ptr), dtype=torch.int64)
        idx.copy_(torch.topk(probs.view(T, E), k, dim=-1).indices.flatten())
        return 0
    except Exception:  # never unwind through C
        logging.getLogger(__name__).exception("MoE routing callback failed")
        return -5


ROUTE_CALLBACK = ROUTE(_route)


def check_layout() -> None:
    got = cpu.lib().ridgeline_moe_fields()
    if got != len(HEADER) + len(WEIGHTS) * WEIGHT_FIELDS:
        raise RuntimeError(f"moe.c header has {got} fields, expected {len(HEADER) + len(WEIGHTS) * WEIGHT_FIELDS}")


def scratch_floats(desc: torch.Tensor, T: int, H: int) -> int:
    return cpu.lib().ridgeline_moe_scratch(desc.data_ptr(), T, H)


def run(desc: torch.Tensor, x: torch.Tensor, layer: int, scratch: torch.Tensor) -> torch.Tensor:
    """x [T, H] fp32 contiguous -> [T, H]; scratch holds scratch_floats(desc, T, H) floats."""
    T, H = x.shape
    out = torch.empty_like(x)
    rc = cpu.lib().ridgeline_moe(desc.data_ptr(), x.data_ptr(), out.data_ptr(), T, H, scratch.data_ptr(),
                                 ctypes.cast(ROUTE_CALLBACK, ctypes.c_void_p), layer, torch.get_num_threads())
    if rc:
        raise RuntimeError(f"MoE kernel failed ({rc}) in layer {layer}")
    return out


def route(desc: torch.Tensor, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] fp32 contiguous -> (experts [T, k] int64 largest first, weights [T, k] fp32)."""
    T, H = x.shape
    E, k = int(desc[0]), int(desc[1])
    probs, idx, w = torch.empty(T, E), torch.empty(T, k, dtype=torch.int64), torch.empty(T, k)
    rc = cpu.lib().ridgeline_moe_route(desc.data_ptr(), x.data_ptr(), T, H, probs.data_ptr(), idx.data_ptr(),
                                       w.data_ptr(), ctypes.cast(ROUTE_CALLBACK, ctypes.c_void_p), layer,
                                       torch.get_num_threads())
    if rc:
        raise RuntimeError(f"MoE routing failed ({rc}) in layer {layer}")
    return idx, w


def experts(desc: torch.Tensor, off: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """xs [R, H] grouped by expert, off [E + 1] int64 (expert e: rows off[e]:off[e + 1]) -> [R, H]."""
    R, H = xs.shape
    E, inter = int(desc[0]), int(desc[2])
    ys, buf = torch.empty_like(xs), torch.empty(2 * E + R * 3 * inter)
    rc = cpu.lib().ridgeline_moe_experts(desc.data_ptr(), off.data_ptr(), xs.data_ptr(), ys.data_ptr(), H,
                                         buf.data_ptr(), torch.get_num_threads())
    if rc:
        raise RuntimeError(f"MoE expert kernel failed ({rc})")
    return ys


def combine(tok: torch.Tensor, wt: torch.Tensor, ys: torch.Tensor, T: int, out: torch.Tensor | None = None):
    """out [T, H] = sum over rows r in order of wt[r] * ys[r] into token tok[r]."""
    out = torch.empty(T, ys.shape[1]) if out is None else out
    cpu.lib().ridgeline_moe_combine(tok.data_ptr(), wt.data_ptr(), ys.data_ptr(), ys.shape[0], out.data_ptr(), T,
                                    ys.shape[1])
    return out


def shared(desc: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
    """out += sigmoid gate * shared expert(x), in place (a layer with a shared expert only)."""
    T, H = x.shape
    inter = int(desc[4])
    buf = torch.empty(T * (3 * inter + H + 1))
    rc = cpu.lib().ridgeline_moe_shared(desc.data_ptr(), x.data_ptr(), out.data_ptr(), T, H, buf.data_ptr(),
                                        torch.get_num_threads())
    if rc:
        raise RuntimeError(f"MoE shared expert kernel failed ({rc})")
