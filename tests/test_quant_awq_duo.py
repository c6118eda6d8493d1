"""AWQ's duo candidates (quant/awq.py best_scale with w_mag: s = mean|x|^a / mean|w|^(1-a)) and its
refined alpha (best_scale's refine: the best alpha's neighbours at a finer step).

The weight magnitude is each channel's weight relative to its own quantization group; folding duo
scales keeps the float function under grouped-query attention (the tied v -> o columns must get one
scale, which an untied weight magnitude would break); on the block output the search with duo
candidates is never worse than the plain one (tests/test_quant_awq_block.py: the folder it writes still
beats round-to-nearest)."""
import pytest
import torch

from ridgeline.quant import awq
from ridgeline.quant.quantize import QuantizeOptions
from quant_helpers import salient_model
from test_quant_awq_block import assert_same_function, fold_every_layer, layer0_scorer, scored_groups

DUO = QuantizeOptions("awq", 4, 32, True, awq_duo=True)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return salient_model(tmp_path_factory.mktemp("awqduo") / "src")


def test_weight_magnitude_is_relative_to_each_group():
    W = torch.randn(8, 64)
    W[:, 5] = 100.0  # the largest of every row's first group
    W[:, 40] = -100.0  # and of every row's second group
    m = awq.weight_magnitude([W[:4], W[4:]], 32)
    assert m.shape == (64,)
    assert float(m[5]) == 1.0 and float(m[40]) == 1.0
    assert bool((m > 0).all()) and float(m[[c for c in range(64) if c not in (5, 40)]].max()) < 0.05
    # a whole group scaled up leaves it unchanged: only the position within the group counts
    W2 = W.clone()
    W2[:, 32:] *= 1000
    assert torch.allclose(awq.weight_magnitude([W2], 32), awq.weight_magnitude([W], 32))


def test_duo_candidates_can_win_and_the_plain_grid_stays_available():
    x = torch.tensor([1.0, 2.0, 4.0, 8.0])
    w = torch.tensor([0.5, 0.25, 1.0, 0.125])
    want = x.pow(0.5) / w.pow(0.5)
    want = want / (want.max() * want.min()).sqrt()
    s, alpha, duo = awq.best_scale(lambda s: float(((s - want) ** 2).sum()), x, w, alphas=(0.0, 0.5))
    assert duo and alpha == 0.5 and torch.allclose(s, want)
    s, alpha, duo = awq.best_scale(lambda s: float(((s - 1) ** 2).sum()), x, w, alphas=(0.0, 0.5))
    assert not duo and alpha == 0.0 and torch.equal(s, torch.ones(4))


def test_refine_scores_the_winners_neighbours_only():
    x = torch.tensor([1.0, 2.0, 4.0, 8.0])
    w = torch.tensor([0.5, 0.25, 1.0, 0.125])
    seen = []

    def score(target):
        def f(s):
            seen.append(s)
            return float(((s - target) ** 2).sum())
        return f
    want = x.pow(0.525) / w.pow(0.475)
    want = want / (want.max() * want.min()).sqrt()
    s, alpha, duo = awq.best_scale(score(want), x, w, alphas=(0.0, 0.5, 0.95), refine=0.025)
    assert duo and alpha == pytest.approx(0.525) and torch.allclose(s, want)
    assert len(seen) == 6 + 2  # the grid of both kinds, then 0.475 and 0.525 of the duo kind
    seen.clear()
    s, alpha, duo = awq.best_scale(score(torch.ones(4)), x, w, alphas=(0.0, 0.5), refine=0.025)
    assert not duo and alpha == 0.0 and torch.equal(s, torch.ones(4)) and len(seen) == 4 + 1  # -0.025 is off [0, 1]


def test_folded_duo_scales_keep_the_float_function_with_grouped_query_attention(src, tmp_path):
    _, tensors = fold_every_layer(src, DUO)
    assert_same_function(src, tensors, tmp_path)


def test_block_search_with_duo_is_never_worse_than_without(src):
    with layer0_scorer(src) as (stats, scorer):
        for engine_name, weights in scored_groups(src):
            mean_abs = stats[engine_name].mean_abs
            plain, _, plain_duo = scorer.search(engine_name, weights, mean_abs)
            w_mag = awq.weight_magnitude(list(weights.values()), 32)
            s, _, _ = scorer.search(engine_name, weights, mean_abs, w_mag=w_mag)
            assert not plain_duo
            assert scorer.error(engine_name, weights, s) <= scorer.error(engine_name, weights, plain)


def test_duo_is_an_awq_option():
    with pytest.raises(Exception, match="awq only"):
        QuantizeOptions("gptq", 4, 32, True, awq_duo=True).check()


def test_the_folder_records_the_awq_search_settings():
    from ridgeline.quant.quantize import quantization_config
    qc = quantization_config(DUO, "calibration.txt", 1024)
    assert (qc["awq_duo"], qc["awq_refine"], qc["awq_score_tokens"]) == (True, 0.0, 2048)
    assert quantization_config(QuantizeOptions("awq", 4, 32, True), "calibration.txt", 1024)["awq_duo"] is False
