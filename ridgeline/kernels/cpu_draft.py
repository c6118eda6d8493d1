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


def eagle_step(fc_desc: torch.Tensor, meta: np.ndarray, at: dict, at_group: int, x: torch.Tensor,
               dims: torch.Tensor, eps: float, scale: float, layer: torch.Tensor, cos_sin: torch.Tensor,
               buf: torch.Tensor, emb: torch.Tensor | None = None, own_emb: torch.Tensor | None = None,
               table: torch.Tensor | None = None, qk_desc: torch.Tensor | None = None,
               qk: torch.Tensor | None = None) -> None:
    """The head's step (kernels/eagle_draft.c) -> x [T, H] its features, and with qk_desc the pointer's
    projections qk [T, 2d]. meta (numpy int64) holds at the element offsets `at` the rows' positions,
    slots, hidden-row addresses, next and own token ids (read where emb / own_emb [T, H] fp32 are
    None: looked up in table), and the attention group row at at_group; layer: the one-layer stack
    descriptor; buf: T * 6H + the stack's scratch floats."""
    from ridgeline.kernels.cpu_ops import EMBED_FORMATS
    T, base = x.shape[0], meta.ctypes.data

    def ptr(name):
        return base + 8 * at[name]
    rc = cpu.lib().ridgeline_eagle_step(
        fc_desc.data_ptr(), ptr("rows"), None if emb is None else emb.data_ptr(),
        None if own_emb is None else own_emb.data_ptr(), None if table is None else table.data_ptr(),
        -1 if table is None else EMBED_FORMATS[table.dtype], 0 if table is None else table.shape[0], ptr("ids"),
        ptr("own"), x.data_ptr(), dims.data_ptr(), eps, scale, layer.data_ptr(), cos_sin.data_ptr(), T,
        ptr("positions"), ptr("slots"), base + 8 * at_group, None if qk_desc is None else qk_desc.data_ptr(),
        None if qk is None else qk.data_ptr(), 0 if qk is None else qk.shape[1], buf.data_ptr(),
        torch.get_num_threads())
    if rc == -1:
        raise IndexError("a token id is outside the embedding table")
    if rc:
        raise RuntimeError(f"EAGLE head step failed ({rc}): T={T}")
