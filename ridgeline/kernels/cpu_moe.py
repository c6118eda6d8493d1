"""ctypes binding of kernels/moe.c: a sparse MLP's routing and grouped expert matmuls in one call.
The module path (layers/moe.py) and the C decoder stack call the same function on the same
descriptor, so their outputs are bitwise equal."""
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
HEADER = ("experts", "top_k", "inter", "norm_topk", "shared_inter", "counts")
WEIGHTS = ("router", "shared_gate_up", "shared_down", "shared_gate")
WEIGHT_FIELDS = 4


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
