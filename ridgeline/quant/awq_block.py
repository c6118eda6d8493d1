"""AWQ's scale search scored on the output of the block the scaled projections feed, as AWQ scores it:
q/k/v's scale by the attention block's output (o_proj's, o kept float), gate/up's by the MLP's (down
kept float), on the first windows of the layer's calibration inputs (SCORE_TOKENS of them):

    err(s, grids) = || block(x; W) - block(x; R(W diag(s)) diag(s)^-1) ||^2

with R each projection's rounding. The per-projection objective (awq.py: ||X dW^T||^2 from X^T X)
sees each projection alone; through the softmax an error in q or k is not a sum of independent rows,
and the attention sink's few tokens (read by every query) weigh as much as all the others together.
Scoring the block's output weighs each error by what it does there.

The search runs in two passes. First every candidate scale with the plain grids (round-to-nearest
of W diag(s)); then the awq.TOP best of them, and s = 1, with the clipped grids (clip.py), and for
q/k/v also with q and k on plain grids and v clipped (clipping q or k moves every attention score of
the rows it touches). The block output picks among all of these, and the projections are finally
rounded as the winner rounds them (Choice.plain: which stay on plain grids; the clipped grids are
fitted again from the same values and statistics), so the scored error is the one the quantized
block makes on those tokens, up to v's and up's rows, which the v -> o and up -> down pairs rescale
afterwards. s = 1 with plain grids (round-to-nearest) is a candidate, so
on the scored tokens the choice never does worse than round-to-nearest. Candidates are set into the
live layer (its modules, sequential.py), the block run on the kept inputs. The layers behind the
scaled group's producer (down after up, o after v) keep the per-projection search: their block
output is their own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ridgeline.quant import awq, grid

SCORE_TOKENS = 2048  # calibration tokens (whole windows, at least one) each candidate is scored on
BLOCKS = ("self_attn", "mlp")  # the blocks whose input projections are scored on the block's output
DUO = False
UNCLIPPED_IN_ATTENTION = ("q_proj", "k_proj")  # kept on plain grids in the attention's mixed option


@dataclass
class Choice:
    scale: torch.Tensor  # [K] float32
    alpha: float
    plain: set[str]  # checkpoint weight names rounded on plain grids (the others on clipped grids)
    error: float


class BlockScorer:
    """Layer i's attention and MLP inputs and float outputs on its first windows, kept to score AWQ's
    candidate scales of the projections that read them."""

    def __init__(self, runner, i: int, group: int, symmetric: bool, tokens: int = SCORE_TOKENS):
        self.runner, self.group, self.symmetric = runner, group, symmetric
        layer = runner.inner.layers[i]
        n = max(1, min(len(runner.windows), tokens // max(len(runner.windows[0]), 1)))
        blocks = {"self_attn.qkv_proj": (layer.self_attn, True), "mlp.gate_up_proj": (layer.mlp, False)}
        self.blocks = {k: v for k, v in blocks.items() if k.split(".")[0] in BLOCKS}
        self.probes = runner.block_probes(i, n)  # {"self_attn"|"mlp": ([inputs], [outputs])}

    def scores(self, engine_name: str) -> bool:
        return engine_name.split(".", 3)[-1] in self.blocks

    def search(self, engine_name: str, weights: dict[str, torch.Tensor], mean_abs: torch.Tensor, H: torch.Tensor,
               alphas: tuple[float, ...] = awq.ALPHAS) -> Choice:
        """weights: the group's checkpoint-named float weights [N_i, K]; H: X^T X of their input."""
        cands = awq.candidates(mean_abs, list(weights.values()), self.group, alphas, DUO)
        plain = sorted((self.error(engine_name, weights, s), i) for i, (_, s) in enumerate(cands))
        err, i = plain[0]
        best = Choice(cands[i][1], cands[i][0], set(weights), err)
        for i in sorted({i for _, i in plain[:awq.TOP]} | {0}):
            alpha, s = cands[i]
            clipped = {n: awq.clipped_grid(W, H, s, self.group, self.symmetric) for n, W in weights.items()}
            for grids in self._clip_options(engine_name, clipped):
                err = self.error(engine_name, weights, s, grids)
                if err < best.error:
                    best = Choice(s, alpha, set(weights) - set(grids), err)
        return best

    def error(self, engine_name: str, weights: dict[str, torch.Tensor], s: torch.Tensor,
              grids: dict[str, grid.GroupGrid] | None = None) -> float:
        """err(s, grids) on the scored windows (a weight without a grid in grids: its plain grid); leaves
        the group's live weights at those values."""
        grids = grids or {}
        return self.block_error(engine_name, {n: awq.rounded(W, s, self.group, self.symmetric, grids.get(n))
                                              for n, W in weights.items()})

    def block_error(self, engine_name: str, values: dict[str, torch.Tensor]) -> float:
        """The block's squared output error on the scored windows with the group's weights set to values
        (checkpoint-named, every weight of the group); they stay set."""
        block, attention = self.blocks[engine_name.split(".", 3)[-1]]
        xs, refs = self.probes["self_attn" if attention else "mlp"]
        self.runner.set_weights(values)
        outs = self.runner.run_block(block, xs, attention)
        return sum(float(((o - r) ** 2).sum()) for o, r in zip(outs, refs))

    def _clip_options(self, engine_name: str, clipped: dict[str, grid.GroupGrid]) -> list[dict]:
        options = [clipped]
        if self.blocks[engine_name.split(".", 3)[-1]][1]:  # attention: q and k unclipped, v clipped
            options.append({n: g for n, g in clipped.items() if not n.removesuffix(".weight").endswith(
                UNCLIPPED_IN_ATTENTION)})
        return options
