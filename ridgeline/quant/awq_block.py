"""AWQ's scale search scored on the output of the block the scaled projections feed, as AWQ scores it:
q/k/v's scale by the attention block's output (o_proj's, o kept float), gate/up's by the MLP's (down
kept float), on the first windows of the layer's calibration inputs (SCORE_TOKENS of them):

    err(s) = || block(x; W) - block(x; Q(W diag(s)) diag(s)^-1) ||^2

The per-projection objective (awq.py: ||X dW^T||^2 from X^T X) sees each projection alone; through the
softmax an error in q or k is not a sum of independent rows, and the attention sink's few tokens
(read by every query) weigh as much as all the others together. Scoring the block's output weighs each
error by what it does there. Candidates are set into the live layer (its modules, sequential.py), the
block run on the kept inputs; alpha = 0 (s = 1, round-to-nearest) is on the grid, so on the scored
tokens the chosen scale never does worse than round-to-nearest. The layers behind the scaled group's
producer (down after up, o after v) keep the per-projection search: their block output is their own.
"""
from __future__ import annotations

import torch

from ridgeline.quant import awq
from ridgeline.formats import grid

SCORE_TOKENS = 2048  # calibration tokens (whole windows, at least one) each candidate is scored on
BLOCKS = ("self_attn", "mlp")  # the blocks whose input projections are scored on the block's output


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

    def search(self, engine_name: str, weights: dict[str, torch.Tensor], mean_abs: torch.Tensor,
               alphas: tuple[float, ...] = awq.ALPHAS, w_mag: torch.Tensor | None = None,
               refine: float = 0.0) -> tuple[torch.Tensor, float, bool]:
        """weights: the group's checkpoint-named float weights [N_i, K] -> (scale [K], alpha, duo);
        w_mag: awq.weight_magnitude of the weights to score the duo candidates too, refine: the finer
        step tried around the best alpha (awq.best_scale)."""
        return awq.best_scale(lambda s: self.error(engine_name, weights, s), mean_abs, w_mag, alphas, refine)

    def error(self, engine_name: str, weights: dict[str, torch.Tensor], s: torch.Tensor) -> float:
        """err(s) on the scored windows; leaves the group's live weights at those values."""
        block, attention = self.blocks[engine_name.split(".", 3)[-1]]
        xs, refs = self.probes["self_attn" if attention else "mlp"]
        self.runner.set_weights({n: self._rounded(W, s) for n, W in weights.items()})
        outs = self.runner.run_block(block, xs, attention)
        return sum(float(((o - r) ** 2).sum()) for o, r in zip(outs, refs))

    def _rounded(self, W: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The values W diag(s), rounded to the int4 grid, then divided by s: what the layer computes
        with the scale folded into its input's producer."""
        Ws = W.float() * s[None, :]
        g = grid.fit_groups(Ws, self.group, self.symmetric)
        return g.dequantize(g.quantize(Ws, self.group), self.group) / s[None, :]
