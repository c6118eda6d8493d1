"""ctypes binding of kernels/draft_pick.c: an EAGLE head's drafts for n rows in one call (its LM-head
rows' matmul, the softmax's top token and probability, the copy pointer's mixture where a row has
one). spec/eagle.py gathers the arguments; this module only moves pointers."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.kernels import cpu


def available() -> bool:
    return cpu.lib() is not None


def draft_pick(rows_desc: torch.Tensor, feats: torch.Tensor, logits: torch.Tensor, vocab_ids: torch.Tensor | None,
               vocab_index: torch.Tensor | None, q: torch.Tensor | None, keys: np.ndarray, payload: np.ndarray,
               m: np.ndarray, scale: float, gate: torch.Tensor | None, gate_b: float, mass: torch.Tensor,
               work: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor) -> None:
    """feats [n, H] fp32; logits [n, V] scratch; rows_desc the rows' weight descriptor (format, data,
    scale, bias); q [n, d] or None (no pointer); keys, payload, m [n] int64: per row the address of
    its keys [m_i, d] fp32 and payload [m_i] int64, and m_i; gate [H + d + 3]; mass [vocab] fp32
    zeros; work [max m_i + d] fp32 -> tokens [n] int64, probs [n] fp32."""
    n, H = feats.shape
    rc = cpu.lib().ridgeline_draft_pick(
        rows_desc.data_ptr(), feats.data_ptr(), logits.data_ptr(), n, H, logits.shape[1],
        None if vocab_ids is None else vocab_ids.data_ptr(), None if vocab_index is None else vocab_index.data_ptr(),
        None if q is None else q.data_ptr(), keys.ctypes.data, payload.ctypes.data, m.ctypes.data,
        0 if q is None else q.shape[1], scale, None if gate is None else gate.data_ptr(), gate_b, mass.data_ptr(),
        work.data_ptr(), tokens.data_ptr(), probs.data_ptr(), torch.get_num_threads())
    if rc:
        raise RuntimeError(f"draft pick failed ({rc}): n={n} V={logits.shape[1]} H={H}")


def eagle_step(fc_desc: torch.Tensor, emb: torch.Tensor, hidden: torch.Tensor, x: torch.Tensor, dims: torch.Tensor,
               eps: float, scale: float, layer: torch.Tensor, cos_sin: torch.Tensor, meta: np.ndarray,
               offsets: tuple[int, int, int], buf: torch.Tensor, own_emb: torch.Tensor | None = None,
               qk_desc: torch.Tensor | None = None, qk: torch.Tensor | None = None) -> None:
    """emb, hidden [T, H] fp32 contiguous -> x [T, H] the head's features. layer: its one-layer stack
    descriptor; meta (numpy int64) holds positions [T] at 0, then slots [T], the group row at the offsets
    given (in elements); buf: T * 5H + the stack's scratch floats. With own_emb [T, H], also the
    pointer's projections qk [T, 2d] (qk_desc: their weight descriptor, with the bias)."""
    T = emb.shape[0]
    base = meta.ctypes.data
    rc = cpu.lib().ridgeline_eagle_step(fc_desc.data_ptr(), emb.data_ptr(), hidden.data_ptr(), x.data_ptr(),
                                        dims.data_ptr(), eps, scale, layer.data_ptr(), cos_sin.data_ptr(), T, base,
                                        base + 8 * offsets[0], base + 8 * offsets[1],
                                        None if own_emb is None else own_emb.data_ptr(),
                                        None if qk_desc is None else qk_desc.data_ptr(),
                                        None if qk is None else qk.data_ptr(), 0 if qk is None else qk.shape[1],
                                        buf.data_ptr(), torch.get_num_threads())
    if rc:
        raise RuntimeError(f"EAGLE head step failed ({rc}): T={T}")
