"""The EAGLE-style draft head (EAGLE-1): for position j, fc over [embedding of token j+1, the target's
hidden state at j] -> one decoder layer (causal attention over the head's own past positions) ->
a feature f_j that stands in for the target's hidden state at j+1; the target's own LM head (or the
rows of it for a reduced vocabulary of frequent tokens, as FR-Spec) turns f_j into logits for token
j+2. Drafting a chain feeds f_j back as the hidden state of position j+1. Optionally a copy pointer
(speculative/eagle_pointer.py) mixes in the tokens that followed earlier positions like this one.

"Hidden state" is the target's last layer after its final norm: what its LM head reads.

Plain torch, the same code for training (whole sequences, `forward`) and drafting (a few new
positions per request against a per-request K/V cache, `step`). Shapes: H hidden, h/hkv heads/KV
heads of size d, I the MLP width. K/V caches hold rotated keys: [positions, hkv, d]."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_ops
from ridgeline.speculative.eagle_pointer import CopyPointer
from ridgeline.speculative.eagle_stack import HeadCache, HeadStack, interleave_rows, why_not

SMALL_QUERIES = 16  # _attend computes up to this many queries by hand (a drafting step, a verification's catch-up)


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    pointer_dim: int = 0  # a copy pointer of this width (speculative/eagle_pointer.py); 0: none
    pointer_match: int = 0  # its exact-match lengths read up to this many tokens; 0: none

    def to_dict(self) -> dict:
        return asdict(self)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] rotated by position (halves layout); cos, sin [T, 1, d/2]."""
    d = x.shape[-1]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        H, h, hkv, d, I = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        self.fc = nn.Linear(2 * H, H)
        self.attn_norm = nn.RMSNorm(H, eps=cfg.rms_norm_eps)
        self.qkv = nn.Linear(H, (h + 2 * hkv) * d, bias=False)
        self.o = nn.Linear(h * d, H, bias=False)
        self.mlp_norm = nn.RMSNorm(H, eps=cfg.rms_norm_eps)
        self.gate_up = nn.Linear(H, 2 * I, bias=False)
        self.down = nn.Linear(I, H, bias=False)
        self.pointer = CopyPointer(H, cfg.pointer_dim, cfg.pointer_match) if cfg.pointer_dim else None
        # not saved: a function of the config
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        self.register_buffer("inv_freq", inv, persistent=False)
        self._packed: dict[nn.Linear, object] | None = None  # set by use_kernels (drafting only)
        self._c_ops = False  # use_kernels on a CPU with the engine's C ops: norms, SiLU*up and rotary table there
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None  # drafting's cos, sin [P, 1, d/2] (fp32)
        self.stack = None  # use_kernels where the C decoder stack runs the layer (speculative/eagle_stack.py)

    def use_kernels(self, pack) -> None:
        """Draft with other matmul kernels: pack(weight [N, K]) -> a callable x [M, K] -> x @ W^T
        (fp32), e.g. the engine's own packed CPU kernels (their thread pool, their weight prefetch).
        The head's other weights and activations are then fp32. Inference only: training keeps torch."""
        self.float()
        self._packed = {m: pack(m.weight.detach()) for m in (self.fc, self.qkv, self.o, self.gate_up, self.down)}
        if self.pointer is not None:
            self.pointer.use_kernels(pack)
        self._c_ops = self.fc.weight.device.type == "cpu" and cpu_ops.available()
        self.stack = None
        if self._c_ops:
            c = self.cfg
            w = self.qkv.weight.detach()
            q, k, v = w.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim])
            qkv = pack(torch.cat([interleave_rows(q, c.num_heads, c.head_dim),
                                  interleave_rows(k, c.num_kv_heads, c.head_dim), v]).contiguous())
            linears = [self._packed[self.fc], qkv] + [self._packed[m] for m in (self.o, self.gate_up, self.down)]
            pointer = [self.pointer._qk] if self.pointer is not None else []
            if why_not(linears + pointer, c.head_dim) is None:
                self.stack = HeadStack(self, *linears)

    def _fused(self) -> bool:
        """Drafting on the engine's CPU kernels (activations fp32, as the head's weights): element-wise
        steps in its C ops too. Training (gradients on) keeps torch."""
        return self._c_ops and not torch.is_grad_enabled()

    def _norm(self, mod: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
        if self._fused():
            return cpu_ops.rmsnorm(x.contiguous(), mod.weight, self.cfg.rms_norm_eps)
        return mod(x)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, d/2] of positions; drafting reads them from a table grown as positions do."""
        if not self._fused() or positions.numel() == 0:
            ang = (positions.float()[:, None] * self.inv_freq[None])[:, None]
            return ang.cos().to(dtype), ang.sin().to(dtype)
        need = int(positions.max()) + 1
        if self._table is None or self._table[0].shape[0] < need:
            size = max(need, 2 * (0 if self._table is None else self._table[0].shape[0]), 256)
            ang = (torch.arange(size, dtype=torch.float32)[:, None] * self.inv_freq[None])[:, None]
            self._table = (ang.cos(), ang.sin())
        return self._table[0][positions], self._table[1][positions]

    def _lin(self, mod: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None or torch.is_grad_enabled():
            return mod(x)
        y = self._packed[mod](x)
        return y if mod.bias is None else y + mod.bias

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        c = self.cfg
        kv = c.num_kv_heads * c.head_dim
        q, k, v = self._lin(self.qkv, self._norm(self.attn_norm, x)).split([c.num_heads * c.head_dim, kv, kv], -1)
        T = x.shape[0]
        cos, sin = self._cos_sin(positions, x.dtype)  # [T, 1, d/2]
        q = _rope(q.view(T, c.num_heads, c.head_dim), cos, sin)
        k = _rope(k.view(T, c.num_kv_heads, c.head_dim), cos, sin)
        return q, k, v.view(T, c.num_kv_heads, c.head_dim)

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + self._lin(self.o, attn.reshape(x.shape[0], -1))
        gate_up = self._lin(self.gate_up, self._norm(self.mlp_norm, x))
        if self._fused():
            return x + self._lin(self.down, cpu_ops.silu_mul(gate_up.contiguous()))
        gate, up = gate_up.chunk(2, -1)
        return x + self._lin(self.down, F.silu(gate) * up)

    def _attend(self, q, k, v, causal_offset: int) -> torch.Tensor:
        """q [n, h, d] at the last n of the m key positions k, v [m, hkv, d] -> [n, h, d]."""
        n, m = q.shape[0], k.shape[0]
        if n <= SMALL_QUERIES:
            # drafting: a few queries against the whole cache, in fp32 by hand with the query heads
            # grouped per KV head. SDPA's path for a masked grouped call expands K and V to every query
            # head first: 0.7 ms of a 1.5 ms catch-up at a few hundred positions (4x cheaper for n = 1)
            h, d, hkv = q.shape[1], q.shape[2], k.shape[1]
            s = torch.einsum("nhgd,mhd->hgnm", q.reshape(n, hkv, h // hkv, d).float(), k.float()) * d ** -0.5
            if n > 1:  # query i (position m - n + i) sees keys <= m - n + i
                s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=q.device).triu(causal_offset + 1),
                                  float("-inf"))
            out = torch.einsum("hgnm,mhd->nhgd", torch.softmax(s, -1), v.float())
            return out.reshape(n, h, d).to(q.dtype)
        mask = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(causal_offset)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             attn_mask=mask, enable_gqa=True)
        return out.transpose(0, 1)

    def forward(self, hidden: torch.Tensor, next_emb: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One sequence, whole (training): hidden, next_emb [T, H] (the target's hidden at j, the
        embedding of token j+1), positions [T] -> features [T, H] (f_j ~ hidden at j+1)."""
        x = self._lin(self.fc, torch.cat([next_emb, hidden], -1))
        q, k, v = self._qkv(x, positions)
        return self._finish(x, self._attend(q, k, v, 0))

    def unrolled(self, hidden: torch.Tensor, next_emb: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor,
                 steps: int) -> list[torch.Tensor]:
        """Training as drafting runs ("training-time test"): several sequences packed into rows, each
        sequence's rows contiguous (hidden, next_emb [T, H]; positions, seq_ids [T]), unrolled `steps`
        draft positions deep. Returns feats[s - 1] [T, H] for s = 1 .. steps: step s at row j reads
        step s - 1's feature of row j - 1 as its hidden state (what a chain's s-th draft reads), and
        attends to step-1 keys of positions <= j - s + 1 (fed from the target's hidden states) and to
        step r's key at position j - s + r for r = 2 .. s (the chain's own earlier drafts), all in its
        own sequence. Row j of step s is meaningful when positions[j] >= s - 1. feats[0] equals
        `forward`; feats[s - 1][j] equals the s-th `step` of a chain that starts from the cache of
        positions <= j - s + 1 (tests/test_eagle.py checks both)."""
        bounds = (torch.nonzero(seq_ids[1:] != seq_ids[:-1]).flatten() + 1).tolist()
        segments = list(zip([0] + bounds, bounds + [len(seq_ids)]))
        feats, ks, vs, inp = [], [], [], hidden
        for s in range(1, steps + 1):
            if s > 1:  # row j reads row j - 1's feature (a sequence's first row is never meaningful at s > 1)
                inp = torch.cat([feats[-1][:1], feats[-1][:-1]])
            x = self._lin(self.fc, torch.cat([next_emb, inp], -1))
            q, k, v = self._qkv(x, positions)
            ks.append(k)
            vs.append(v)
            outs = []
            for a, b in segments:  # attention within each sequence: [n, s n] keys of its s steps
                pq, pk = positions[a:b, None], positions[None, a:b]
                # every row sees at least its own key (r = s, or position <= itself at s = 1)
                mask = torch.cat([pk <= pq - s + 1] + [pk == pq - s + r for r in range(2, s + 1)], 1)
                kk = torch.cat([kr[a:b] for kr in ks]).transpose(0, 1)
                vv = torch.cat([vr[a:b] for vr in vs]).transpose(0, 1)
                outs.append(F.scaled_dot_product_attention(q[a:b].transpose(0, 1), kk, vv, attn_mask=mask,
                                                           enable_gqa=True).transpose(0, 1))
            feats.append(self._finish(x, torch.cat(outs)))
        return feats

    def step(self, hidden: torch.Tensor, next_emb: torch.Tensor, positions: torch.Tensor,
             caches: list[tuple[torch.Tensor, torch.Tensor]], counts: list[int]) -> tuple[torch.Tensor, list]:
        """Drafting: new positions of several requests, concatenated (counts[i] rows of request i, in
        order, after its cache caches[i] = (K, V)). Returns (features [sum(counts), H], the caches
        with the new positions appended)."""
        if self.stack is not None and not torch.is_grad_enabled():
            return self.stack.step(next_emb, hidden, positions.tolist(), caches, counts)[:2]
        x = self._lin(self.fc, torch.cat([next_emb, hidden], -1))
        q, k, v = self._qkv(x, positions)
        outs, new_caches, row = [], [], 0
        for (ck, cv), n in zip(caches, counts):
            kk, vv = torch.cat([ck, k[row:row + n]]), torch.cat([cv, v[row:row + n]])
            outs.append(self._attend(q[row:row + n], kk, vv, kk.shape[0] - n))
            new_caches.append((kk, vv))
            row += n
        return self._finish(x, torch.cat(outs)), new_caches

    def step_pointer(self, hidden: torch.Tensor, next_emb: torch.Tensor, own_emb: torch.Tensor, positions: torch.Tensor,
                     caches: list, counts: list[int]) -> tuple[torch.Tensor, list, torch.Tensor, torch.Tensor]:
        """`step`, and the copy pointer's queries and keys [T, d] of the same rows (own_emb [T, H]: the
        embeddings of the rows' own tokens): (features, caches, queries, keys); one C call on the stack."""
        if self.stack is not None and not torch.is_grad_enabled():
            feats, caches, qk = self.stack.step(next_emb, hidden, positions.tolist(), caches, counts, own_emb)
            d = self.pointer.dim
            return feats, caches, qk[:, :d], qk[:, d:]
        feats, caches = self.step(hidden, next_emb, positions, caches, counts)
        q, k = self.pointer.query_key(CopyPointer.describe(next_emb, own_emb, hidden, feats))
        return feats, caches, q, k

    def empty_cache(self) -> tuple[torch.Tensor, torch.Tensor] | HeadCache:
        if self.stack is not None:
            return HeadCache()
        c = self.cfg
        z = torch.empty(0, c.num_kv_heads, c.head_dim, dtype=self.fc.weight.dtype, device=self.fc.weight.device)
        return z, z

    def release(self, cache) -> None:
        """A request's cache is no longer needed (its pool blocks go back)."""
        if isinstance(cache, HeadCache) and self.stack is not None:
            self.stack.release(cache)
