"""Training an EAGLE head on self-distillation data (torch, on the CPU).

For each sample of n tokens, position j = 0 .. n-2 reads (hidden_j, token_{j+1}) and its feature f_j
should be the target's hidden_{j+1}: loss = smooth-L1(f_j, hidden_{j+1}) + w * cross-entropy of the
head's logits (the target's LM head rows over the draft vocabulary) against the target's own
distribution there (softmax of the same rows applied to hidden_{j+1}). Inputs get small uniform
noise, as in EAGLE, so the head tolerates its own features when it drafts a chain. AdamW, linear
warm-up then cosine decay, gradient clipping; sequences are accumulated `batch` at a time."""
from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from ridgeline.spec.eagle_head import EagleHead, HeadConfig
from ridgeline.spec.train_data import Sample


def train_head(embed, rows: torch.Tensor, samples: list[Sample], cfg: HeadConfig, epochs: float, seed: int,
               lr: float = 1e-3, batch: int = 8, ce_weight: float = 0.1, noise: float = 0.1,
               progress: bool = True) -> tuple[EagleHead, dict]:
    """embed: token ids -> the target's embeddings (fp32); rows [V', H] fp32, the LM head rows the
    head's logits use. Returns the head and a summary (last losses, top-1 agreement with the target
    on the training data)."""
    from tqdm import tqdm
    torch.manual_seed(seed)
    rng = random.Random(seed)
    head = EagleHead(cfg)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    order = [i for i in range(len(samples)) if len(samples[i].tokens) > 2]
    total = max(1, int(epochs * len(order)) // batch)
    warm = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    bar = tqdm(total=total, unit="step", desc="training the head", disable=not progress)
    stats = {"steps": total, "loss": float("nan"), "top1": float("nan")}
    queue: list[int] = []
    for step in range(total):
        opt.zero_grad(set_to_none=True)
        agree = count = 0
        loss_sum = 0.0
        for _ in range(batch):
            if not queue:
                queue = rng.sample(order, len(order))
            loss, a, c = _sample_loss(head, embed, rows, samples[queue.pop()], ce_weight, noise)
            (loss / batch).backward()
            loss_sum += float(loss.detach()) / batch
            agree, count = agree + a, count + c
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        stats.update(loss=loss_sum, top1=agree / max(count, 1))
        bar.set_postfix(loss=f"{loss_sum:.3f}", top1=f"{stats['top1']:.2f}")
        bar.update()
    bar.close()
    return head.eval(), stats


def _sample_loss(head: EagleHead, embed, rows: torch.Tensor, s: Sample, ce_weight: float,
                 noise: float) -> tuple[torch.Tensor, int, int]:
    h = s.hidden.float()
    inp, target = h[:-1], h[1:]
    if noise:
        inp = inp + (torch.rand_like(inp) - 0.5) * (2 * noise * inp.std())
    with torch.no_grad():
        emb = embed(s.tokens[1:]).float()
        p = torch.softmax(target @ rows.T, -1)
    feats = head(inp, emb, torch.arange(len(inp)))
    logits = feats @ rows.T
    loss = F.smooth_l1_loss(feats, target) + ce_weight * -(p * torch.log_softmax(logits, -1)).sum(-1).mean()
    agree = int((logits.argmax(-1) == p.argmax(-1)).sum())
    return loss, agree, len(inp)
