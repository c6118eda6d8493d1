"""ctypes binding of kernels/eagle_draft.c: an EAGLE head's step (fc, its layer on the decoder stack,
the copy pointer's projections) and its drafts for n rows (its LM-head rows' matmul, the softmax's top
token and probability, the copy pointer's mixture), one call each. speculative/eagle_stack.py and
speculative/eagle.py gather the arguments; this module only moves addresses. Small index arrays are numpy
(built from lists in microseconds); tensors are passed by data_ptr."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.kernels import cpu


def available() -> bool:
    return cpu.lib() is not None


def addr(a: np.ndarray) -> int:
    """The address of a numpy array's data (cheaper than a.ctypes.data)."""
    return a.__array_interface__["data"][0]


def draft_pick(rows_desc: torch.Tensor, feat_rows: np.ndarray, feats: torch.Tensor, logits: torch.Tensor,
               vocab_ids: torch.Tensor | None, vocab_index: torch.Tensor | None, q_rows: np.ndarray | None,
               keys: np.ndarray, payload: np.ndarray, m: np.ndarray, scale: float, gate: torch.Tensor | None,
               gate_b: float, mass: torch.Tensor, work: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor,
               match: np.ndarray | None = None, match_bias: torch.Tensor | None = None) -> None:
    """n = len(feat_rows) rows: feat_rows [n] int64 addresses of fp32 features [H]; feats [>= n, H] and
    logits [>= n, V] fp32 scratch; rows_desc the LM-head rows' weight descriptor (format, data, scale,
    bias); q_rows [n] addresses of the pointer's queries [d] (None: no pointer); keys, payload, m [n]
    int64: per row the address of its keys [m_i, d] fp32 and payload [m_i] int64, and m_i; gate
    [H + d + 3] (+ 1 for a pointer reading exact matches); mass [vocab] fp32 zeros; work [max m_i + d] fp32
    -> tokens [>= n] int64, probs [>= n] fp32. match_bias [M + 1] fp32: the pointer's bias by match length
    (speculative/eagle_pointer.py; None: it reads none); match: [3, n] int64 rows: the address of each row's
    tokens (int64, its chain's drafts after them), of its keys' positions (int64 [m_i]), and the index
    of its drafting position's last token."""
    n, H = len(feat_rows), feats.shape[1]
    cap = 0 if match is None else match_bias.shape[0] - 1
    d = 0 if q_rows is None else (gate.shape[0] - H - 3 - (match_bias is not None))
    rc = cpu.lib().ridgeline_draft_pick(
        rows_desc.data_ptr(), addr(feat_rows), feats.data_ptr(), logits.data_ptr(), n, H, logits.shape[1],
        None if vocab_ids is None else vocab_ids.data_ptr(), None if vocab_index is None else vocab_index.data_ptr(),
        None if q_rows is None else addr(q_rows), addr(keys), addr(payload), addr(m), d, scale,
        None if gate is None else gate.data_ptr(), gate_b, mass.data_ptr(), work.data_ptr(), tokens.data_ptr(),
        probs.data_ptr(), None if match is None else addr(match[0]), None if match is None else addr(match[1]),
        None if match is None else addr(match[2]), cap, None if match is None else match_bias.data_ptr(),
        torch.get_num_threads())
    if rc:
        raise RuntimeError(f"draft pick failed ({rc}): n={n} V={logits.shape[1]} H={H}")


def eagle_step(fc_desc: torch.Tensor, meta: np.ndarray, at: dict, at_group: int, T: int, x: torch.Tensor,
               dims: torch.Tensor, eps: float, scale: float, layer: torch.Tensor, cos_sin: torch.Tensor,
               buf: torch.Tensor, emb: torch.Tensor | None = None, own_emb: torch.Tensor | None = None,
               table: torch.Tensor | None = None, table_fmt: int = -1, qk_desc: torch.Tensor | None = None,
               qk: torch.Tensor | None = None, dst: bool = False) -> None:
    """The head's step for T rows (kernels/eagle_draft.c) -> x [>= T, H] its features, and with qk_desc the
    pointer's projections qk [>= T, 2d]. meta (numpy int64) holds at the element offsets `at` the rows' positions,
    slots, hidden-row addresses, next and own token ids (read where emb / own_emb [T, H] fp32 are
    None: looked up in table, of the embedding format table_fmt), with dst the [3, T] addresses rows'
    keys, queries and features are copied to, and the attention group row at at_group; layer: the
    one-layer stack descriptor; buf: T * 6H + the stack's scratch floats."""
    base = addr(meta)

    def ptr(name):
        return base + 8 * at[name]
    rc = cpu.lib().ridgeline_eagle_step(
        fc_desc.data_ptr(), ptr("rows"), None if emb is None else emb.data_ptr(),
        None if own_emb is None else own_emb.data_ptr(), None if table is None else table.data_ptr(), table_fmt,
        0 if table is None else table.shape[0], ptr("ids"), ptr("own"), x.data_ptr(), dims.data_ptr(), eps, scale,
        layer.data_ptr(), cos_sin.data_ptr(), T, ptr("positions"), ptr("slots"), base + 8 * at_group,
        None if qk_desc is None else qk_desc.data_ptr(), None if qk is None else qk.data_ptr(),
        0 if qk is None else qk.shape[1], ptr("dst") if dst else None, buf.data_ptr(), torch.get_num_threads())
    if rc == -1:
        raise IndexError("a token id is outside the embedding table")
    if rc:
        raise RuntimeError(f"EAGLE head step failed ({rc}): T={T}")


# the layout of ridgeline_eagle_chain's arguments (kernels/eagle_draft.c): its int64 fields, its double
# fields, and the per-row fields (each [n], then the rows' head-cache tables [n, nb])
CHAIN_FIELDS = ("rows_w", "feats", "logits", "H", "V", "vocab_ids", "vocab_index", "d", "gate", "mass", "work",
                "match", "match_bias", "fc", "table", "table_fmt", "table_v", "dims", "layer", "cos_sin", "qk_w",
                "qk", "d2", "x", "buf", "chain_q", "n", "k_max", "nb")
CHAIN_FLOATS = ("scale", "gate_b", "eps", "attn_scale", "min_first", "min_path")
CHAIN_ROWS = ("feat", "query", "keys", "payload", "known", "ctx", "kpos", "end", "own", "pos", "k", "mem_n",
              "cache_len")


def eagle_chain(args: np.ndarray, floats: np.ndarray, rows: np.ndarray, tokens: np.ndarray, counts: np.ndarray) -> None:
    """A greedy drafting chain in one call: args [len(CHAIN_FIELDS)] int64 (pointers as integers),
    floats [len(CHAIN_FLOATS)] float64, rows [len(CHAIN_ROWS) * n + n * nb] int64 -> tokens [n, k_max]
    int64 (row i's first counts[i] are its drafts), counts [n] int64. Each array C-contiguous."""
    lib = cpu.lib()
    if not _chain_checked:
        got = tuple(lib.ridgeline_chain_fields(i) for i in range(3))
        if got != (len(CHAIN_FIELDS), len(CHAIN_FLOATS), len(CHAIN_ROWS)):
            raise RuntimeError(f"the C drafting chain's layout {got} is not this module's")
        _chain_checked.append(True)
    rc = lib.ridgeline_eagle_chain(addr(args), addr(floats), addr(rows), addr(tokens), addr(counts),
                                   torch.get_num_threads())
    if rc == -1:
        raise IndexError("a token id is outside the embedding table")
    if rc:
        raise RuntimeError(f"the C drafting chain failed ({rc})")


_chain_checked: list[bool] = []


def copy_rows(dst: torch.Tensor, src: torch.Tensor, dst_rows: np.ndarray, src_rows: np.ndarray) -> None:
    """dst[dst_rows[i]] = src[src_rows[i]]: contiguous host tensors of one dtype and row size, int64 indices."""
    row_bytes = dst.stride(0) * dst.element_size()
    assert src.stride(0) * src.element_size() == row_bytes and len(dst_rows) == len(src_rows)
    cpu.lib().ridgeline_copy_rows(dst.data_ptr(), src.data_ptr(), addr(dst_rows), addr(src_rows), len(dst_rows),
                                  row_bytes)
