"""Training an EAGLE head on self-distillation data (torch, on the CPU).

For each sample of n tokens, position j = 0 .. n-2 reads (hidden_j, token_{j+1}) and its feature f_j
should be the target's hidden_{j+1}: loss = w_f * smooth-L1(f_j, hidden_{j+1}) + w_ce * cross-entropy
of the head's logits (the target's LM head rows over the draft vocabulary) against the target's own
distribution there (softmax of the same rows applied to hidden_{j+1}).

Drafting a chain feeds the head its own feature, so training unrolls the chain as drafting runs it
(EagleHead.unrolled, `unroll` draft positions deep; EAGLE-3's "training-time test"): draft position
s reads the feature the head made at position s - 1, and its loss (weighted decay^(s-1)) teaches it
to continue from its own output rather than only from the target's. Inputs get small uniform noise,
as in EAGLE. Sequences are packed, whole, into optimizer steps of about `batch_tokens` rows each
(block-diagonal attention). AdamW, linear warm-up then cosine decay, gradient clipping. Matmuls run
in bf16 (autocast) where the CPU has native bf16, fp32 otherwise."""
from __future__ import annotations

import math
import random
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from ridgeline.speculative.eagle_head import EagleHead, HeadConfig
from ridgeline.speculative.train_data import Sample


def train_head(embed, rows: torch.Tensor, samples: list[Sample], cfg: HeadConfig, epochs: float, seed: int,
               lr: float = 1e-3, batch_tokens: int = 2048, ce_weight: float = 1.0, feature_weight: float = 1.0,
               noise: float = 0.1, unroll: int = 2, decay: float = 0.8, bf16: bool = False,
               progress: bool = True) -> tuple[EagleHead, dict]:
    """embed: token ids -> the target's embeddings (fp32); rows [V', H] fp32, the LM head rows the
    head's logits use. Returns the head and a summary (last loss, top-1 agreement with the target on
    the training rows of each draft position)."""
    from tqdm import tqdm
    torch.manual_seed(seed)
    rng = random.Random(seed)
    head = EagleHead(cfg)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    order = [i for i in range(len(samples)) if len(samples[i].tokens) > 2]
    tokens = sum(len(samples[i].tokens) - 1 for i in order)
    total = max(1, round(epochs * tokens / batch_tokens))
    warm = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    bar = tqdm(total=total, unit="step", desc="training the head", disable=not progress)
    stats = {"steps": total, "loss": float("nan"), "top1": float("nan"), "top1_by_position": []}
    queue: list[int] = []
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    for _ in range(total):
        batch, n = [], 0
        while n < batch_tokens:
            if not queue:
                queue = rng.sample(order, len(order))
            batch.append(samples[queue.pop()])
            n += len(batch[-1].tokens) - 1
        with autocast:
            loss, agree = _batch_loss(head, embed, rows, batch, ce_weight, feature_weight, noise, unroll, decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        stats.update(loss=float(loss.detach()), top1=agree[0], top1_by_position=agree)
        bar.set_postfix(loss=f"{stats['loss']:.3f}", top1="/".join(f"{a:.2f}" for a in agree))
        bar.update()
    bar.close()
    return head.eval(), stats


def _pack(embed, batch: list[Sample]):
    """-> hidden_j, embedding of token j+1, position j, sequence index, hidden_{j+1}: [T, ...] rows."""
    hs, emb, pos, seq, target = [], [], [], [], []
    for i, s in enumerate(batch):
        h, n = s.hidden.float(), len(s.tokens) - 1
        hs.append(h[:-1])
        target.append(h[1:])
        with torch.no_grad():
            emb.append(embed(s.tokens[1:]).float())
        pos.append(torch.arange(n))
        seq.append(torch.full((n,), i))
    return torch.cat(hs), torch.cat(emb), torch.cat(pos), torch.cat(seq), torch.cat(target)


def _batch_loss(head: EagleHead, embed, rows: torch.Tensor, batch: list[Sample], ce_weight: float,
                feature_weight: float, noise: float, unroll: int, decay: float) -> tuple[torch.Tensor, list[float]]:
    inp, emb, pos, seq, target = _pack(embed, batch)
    if noise:
        inp = inp + (torch.rand_like(inp) - 0.5) * (2 * noise * inp.std())
    with torch.no_grad():
        p = torch.softmax((target @ rows.T).float(), -1)
    loss, agree = 0.0, []
    for s, feats in enumerate(head.unrolled(inp, emb, pos, seq, unroll)):
        rows_s = pos >= s  # rows whose chain starts at a real position
        f, t, ps = feats[rows_s], target[rows_s], p[rows_s]
        logp = torch.log_softmax((f @ rows.T).float(), -1)
        step_loss = ce_weight * -(ps * logp).sum(-1).mean()
        if feature_weight:
            step_loss = step_loss + feature_weight * F.smooth_l1_loss(f.float(), t)
        loss = loss + decay ** s * step_loss
        agree.append(float((logp.argmax(-1) == ps.argmax(-1)).float().mean()))
    return loss, agree
