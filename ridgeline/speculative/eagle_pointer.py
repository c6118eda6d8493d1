"""A copy pointer for the EAGLE head: much of chat traffic repeats its own context (a pasted passage
summarised, an answer quoting the question), and a head that predicts only through the LM head's
rows copies poorly and cannot name a token outside its draft vocabulary at all (on the bench's chat
workload: right 29% of the time where the context's last tokens repeat, 12% of reply tokens outside
an 8,192-token draft vocabulary).

Head position j reads (the target's hidden h_j, token x_{j+1}) and its feature f_j predicts x_{j+2}.
The pointer describes position j by u_j = [embeddings of x_{j+1} and x_j, h_j, f_j] (its last two
tokens, and the context as the target and the head see it) and, from position t, attends over the
earlier positions j < t with a query and keys projected from u (`dim` wide); position j carries the
token x_{j+2} that followed it. The draft distribution is a mixture (a pointer-generator):

    p(v) = (1 - g) * p_head(v) + g * sum_{j < t, x_{j+2} = v} a_tj

with the gate g = sigmoid(w . [f_t, a_t K, max score, max a_t, p_head's top probability]). Trained
after the head, with the head frozen (`train_pointer`): cross-entropy of the mixture against the target's own
next token (over the whole vocabulary), plus the copy attention's own cross-entropy where the token
is in the context (without it the gate closes before the attention learns anything).

Exact matches (`match` = M > 0): the keys see two tokens of each position, and a repeat's best
evidence is longer: where the last 4 tokens occur earlier, the token that followed them was the
target's next one 91% of the time on the bench's chat workload; where that token is right, the
pointer's pick was right 78% of the time before it read matches (89% since). Each score gets a learned bias by the match length L_tj: how many of the
context's last tokens (x_{t+1}, x_t, ...) equal those before position j's payload (x_{j+1}, x_j, ...),
at most M; and the gate reads the longest L_t / M as one more input."""
from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import torch
from torch import nn


def match_lengths(tokens, key_ends, end: int, cap: int):
    """[m] numpy int64: for each key j, how many of tokens[end], tokens[end - 1], ... equal
    tokens[key_ends[j]], tokens[key_ends[j] - 1], ... in a row (an index below 0 ends it), at most
    cap. tokens: numpy int64 (a request's tokens, a chain's drafts after them); key_ends [m] int64."""
    L = np.zeros(len(key_ends), dtype=np.int64)
    alive = np.ones(len(key_ends), dtype=bool)
    for i in range(min(cap, end + 1)):
        idx = key_ends - i
        alive &= idx >= 0
        alive[alive] &= tokens[idx[alive]] == tokens[end - i]
        L += alive
    return L


def match_matrix(tokens: torch.Tensor, cap: int) -> torch.Tensor:
    """L [n - 1, n - 1] int64 for one sequence of n tokens (training): L[t, j] = match_lengths of
    position j's context (x_{j+1}, x_j, ...) against position t's (x_{t+1}, x_t, ...)."""
    eq = tokens[:, None] == tokens[None, :]  # [n, n]: x_a == x_b
    L = torch.zeros(eq.shape, dtype=torch.int64)
    run = torch.ones(eq.shape, dtype=torch.bool)
    for i in range(min(cap, eq.shape[0])):  # row a, column b: x_{a-i} == x_{b-i} (both indices >= 0)
        shifted = torch.zeros_like(eq)
        shifted[i:, i:] = eq[:eq.shape[0] - i, :eq.shape[1] - i]
        run &= shifted
        L += run
    return L[1:, 1:]


class CopyPointer(nn.Module):
    def __init__(self, hidden_size: int, dim: int, match: int = 0):
        super().__init__()
        self.dim, self.match = dim, match
        self.q = nn.Linear(4 * hidden_size, dim)
        self.k = nn.Linear(4 * hidden_size, dim)
        self.gate = nn.Linear(hidden_size + dim + 3 + (1 if match else 0), 1)
        self.scale = nn.Parameter(torch.tensor(dim ** -0.5))
        # score bias by match length 0..match (the match option above); none without
        self.match_bias = nn.Parameter(torch.zeros(match + 1)) if match else None
        self._packed: dict[nn.Linear, object] | None = None  # set by use_kernels (drafting only)

    def use_kernels(self, pack) -> None:
        """Project queries and keys with other matmul kernels (EagleHead.use_kernels); training keeps torch.
        Drafting projects both at once (query_key): one matmul reading both weights."""
        self._packed = {m: pack(m.weight.detach()) for m in (self.q, self.k)}
        self._qk = pack(torch.cat([self.q.weight.detach(), self.k.weight.detach()]).contiguous())
        self._qk_bias = torch.cat([self.q.bias.detach(), self.k.bias.detach()]).float()

    def _lin(self, mod: nn.Linear, u: torch.Tensor) -> torch.Tensor:
        if self._packed is None or torch.is_grad_enabled():
            return mod(u.to(mod.weight.dtype))  # describe()'s fp32 rows into a bf16 head's (a GPU's) dtype
        return self._packed[mod](u) + mod.bias

    def query(self, u: torch.Tensor) -> torch.Tensor:
        """u [n, 4H] -> [n, dim]"""
        return self._lin(self.q, u)

    def key(self, u: torch.Tensor) -> torch.Tensor:
        """u [n, 4H] -> [n, dim]"""
        return self._lin(self.k, u)

    def query_key(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u [n, 4H] -> (queries, keys) [n, dim] each"""
        if self._packed is None or torch.is_grad_enabled():
            return self.query(u), self.key(u)
        y = self._qk(u) + self._qk_bias
        return y[:, :self.dim], y[:, self.dim:]

    @staticmethod
    def describe(next_emb: torch.Tensor, emb: torch.Tensor, hidden: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """u [T, 4H] of positions j: the embeddings of x_{j+1} and x_j, the hidden state read at j, the
        head's f_j."""
        return torch.cat([next_emb, emb, hidden, feats], -1).float()

    def attend(self, q: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor | None, feats: torch.Tensor,
               ptop: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """q [n, d] queries, keys [m, d], allowed [n, m] bool (None: all), feats [n, H], ptop [n] (the
        head's top probability), lengths [n, m] int64 match lengths (with `match`) -> (a [n, m]
        attention, rows of no allowed key all 0; g [n] the gate, 0 for those rows)."""
        s = (q @ keys.T) * self.scale
        longest = None
        if self.match:
            s = s + self.match_bias[lengths]
            longest = (lengths if allowed is None else lengths * allowed).amax(-1).float() / self.match \
                if lengths.shape[-1] else torch.zeros(q.shape[0], device=q.device)
        if allowed is None and keys.shape[0]:  # drafting: every key, no mask to apply
            a = torch.softmax(s, -1)
            return a, self._gate(feats, a @ keys, s.max(-1).values, a.max(-1).values, ptop, longest)
        has = (torch.full((q.shape[0],), keys.shape[0] > 0, dtype=torch.bool, device=q.device)
               if allowed is None else allowed.any(-1))
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        s = s.masked_fill(~has[:, None], 0.0)
        a = torch.softmax(s, -1) * has[:, None]
        top = s.max(-1).values if s.shape[1] else torch.zeros(q.shape[0], device=q.device)
        peak = a.max(-1).values if s.shape[1] else top
        return a, self._gate(feats, a @ keys, top * has, peak, ptop, longest) * has

    def _gate(self, feats, context, top, peak, ptop, longest=None) -> torch.Tensor:
        """g [n] from the drafting feature [n, H], the attended keys [n, d], the top score, the top
        attention weight, the head's top probability [n] (and with `match` the longest match / match)."""
        parts = [feats.float(), context, top[:, None], peak[:, None], ptop.float()[:, None]]
        if self.match:
            parts.append(longest[:, None])
        dt = self.gate.weight.dtype  # a bf16 head's (drafting in torch on a GPU), else fp32
        return torch.sigmoid(self.gate(torch.cat([x.to(dt) for x in parts], -1)).float())[:, 0]


def draft_vocab_index(vocab_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor | None:
    """[vocab_size] each token's row in the draft vocabulary vocab_ids (-1: not in it); None for the
    whole vocabulary."""
    if vocab_ids is None:
        return None
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=vocab_ids.device)
    index[vocab_ids] = torch.arange(len(vocab_ids), device=vocab_ids.device)
    return index


def pick(a: torch.Tensor, g: float, payload: torch.Tensor, head_probs: torch.Tensor, vocab_index: torch.Tensor | None,
         top: tuple[int, float], scratch: torch.Tensor) -> tuple[int, float]:
    """One position's draft from the mixture: a [m] attention over keys whose tokens are payload [m];
    head_probs [V'] the head's distribution over its draft vocabulary; vocab_index [V] a token's row
    in it (-1: not drafted by the head; None: V' is the whole vocabulary); top (token, probability)
    the head's own most likely token; scratch [V] zeros, left zero. -> (token, its probability)."""
    token, ptop = top
    if g <= 0.0 or payload.numel() == 0:
        return token, ptop
    mass = scratch.index_add_(0, payload, a.to(scratch.dtype))[payload]  # [m]: the copy mass of each position's token
    top_mass = float(scratch[token])
    scratch.index_fill_(0, payload, 0.0)
    rows = payload if vocab_index is None else vocab_index[payload]
    own = head_probs[rows.clamp(min=0)] * (rows >= 0)
    score = g * mass + (1 - g) * own
    best = int(score.argmax())
    top_score = (1 - g) * ptop + g * top_mass
    if float(score[best]) > top_score:
        return int(payload[best]), float(score[best])
    return token, top_score


def train_pointer(pointer: CopyPointer, head, embed: Callable, rows: torch.Tensor, vocab_ids: torch.Tensor | None,
                  label: Callable, vocab_size: int, samples: list, epochs: float, seed: int, lr: float = 2e-3,
                  batch_tokens: int = 2048, progress: bool = True) -> dict:
    """Fit the pointer with the head frozen. embed(ids) -> [T, H] the target's embeddings; rows [V', H]
    the head's LM-head rows (vocab_ids their token ids, None: all); label(hidden [T, H]) -> [T] the
    target's own next token from its hidden states (its LM head's argmax, whole vocabulary), a
    token id below vocab_size. Samples
    packed whole into steps of about batch_tokens positions (block-diagonal attention). Returns a
    summary: last loss, and how often (last 50 steps) the mixture gave the target's token at least
    the probability of the head's own top token."""
    from tqdm import tqdm
    torch.manual_seed(seed)
    rng = random.Random(seed)
    index = draft_vocab_index(vocab_ids, vocab_size)
    prepared = [_prepare(head, embed, rows, vocab_ids, index, label, s, pointer.match) for s in samples
                if len(s.tokens) > 2]
    tokens = sum(p["y"].shape[0] for p in prepared)
    total = max(1, round(epochs * tokens / batch_tokens))
    opt = torch.optim.AdamW(pointer.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(1.0, i / total))))
    stats = {"steps": total, "loss": float("nan"), "top1": float("nan")}
    agree: list[float] = []
    queue: list[int] = []
    with tqdm(total=total, unit="step", desc="training the copy pointer", disable=not progress) as bar:
        for _ in range(total):
            batch, n = [], 0
            while n < batch_tokens:
                if not queue:
                    queue = rng.sample(range(len(prepared)), len(prepared))
                batch.append(prepared[queue.pop()])
                n += batch[-1]["y"].shape[0]
            loss, right = _loss(pointer, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(pointer.parameters(), 1.0)
            opt.step()
            sched.step()
            agree = (agree + [right])[-50:]
            stats.update(loss=float(loss.detach()), top1=sum(agree) / len(agree))
            bar.set_postfix(loss=f"{stats['loss']:.3f}", top1=f"{stats['top1']:.2f}")
            bar.update()
    pointer.eval()
    return stats


@torch.no_grad()
def _prepare(head, embed, rows, vocab_ids, index, label, sample, match: int = 0) -> dict:
    """One sample's fixed inputs (the head is frozen): u, f, the head's top probability and token, the
    head's probability of the label, the label and each position's payload."""
    tokens, h = sample.tokens, sample.hidden.float()
    n = len(tokens)
    e = embed(tokens[1:]).float()
    f = head(h[:-1], e, torch.arange(n - 1)).float()
    probs = torch.softmax(f @ rows.T, -1)
    ptop, itop = probs.max(-1)
    y = label(h[1:])
    if vocab_ids is None:
        py = probs.gather(1, y[:, None])[:, 0]
        top_ids = itop
    else:
        r = index[y]
        py = torch.where(r >= 0, probs.gather(1, r.clamp(min=0)[:, None])[:, 0], torch.zeros(()))
        top_ids = vocab_ids[itop]
    payload = torch.cat([tokens[2:], tokens.new_full((1,), -1)])  # x_{j+2}; the last one unknown
    u = CopyPointer.describe(e, embed(tokens[:-1]).float(), h[:-1], f)
    out = {"u": u.to(torch.bfloat16), "f": f.to(torch.bfloat16), "ptop": ptop, "top": top_ids, "py": py, "y": y,
           "payload": payload}
    if match:
        out["L"] = match_matrix(tokens, match).to(torch.int8)
    return out


def _loss(pointer: CopyPointer, batch: list[dict]) -> tuple[torch.Tensor, float]:
    cat = {k: torch.cat([b[k] for b in batch]) for k in batch[0] if k != "L"}
    seq = torch.cat([torch.full((b["y"].shape[0],), i) for i, b in enumerate(batch)])
    T = seq.shape[0]
    idx = torch.arange(T)
    allowed = (seq[:, None] == seq[None, :]) & (idx[None, :] < idx[:, None])  # earlier positions, same sample
    lengths = torch.block_diag(*[b["L"].long() for b in batch]) if pointer.match else None
    u = cat["u"].float()
    a, g = pointer.attend(pointer.query(u), pointer.key(u), allowed, cat["f"], cat["ptop"], lengths)
    match = (cat["payload"][None, :] == cat["y"][:, None]) & allowed
    copy = (a * match).sum(-1)
    p = (1 - g) * cat["py"] + g * copy
    loss = -p.clamp(min=1e-6).log().mean()
    can = match.any(-1)
    if bool(can.any()):
        loss = loss + -copy[can].clamp(min=1e-6).log().mean()
    with torch.no_grad():  # the label at least as likely under the mixture as the head's own top token
        top = (1 - g) * cat["ptop"] + g * (a * (cat["payload"][None, :] == cat["top"][:, None])).sum(-1)
        right = (p >= top - 1e-6).float().mean()
    return loss, float(right)
