import pytest
import torch

from ridgeline.layers.sampler import Sampler, SamplingMetadata, apply_penalties
from ridgeline.sampling_params import SamplingParams

CPU = torch.device("cpu")


def meta_for(params, V, prompts=None, outputs=None, gens=None, eos=(0,)):
    B = len(params)
    return SamplingMetadata.build(params, prompts or [[]] * B, outputs or [[]] * B,
                                  gens or [None] * B, list(eos), V, CPU)


def sample(logits, params, sampler=None, **kw):
    return (sampler or Sampler())(logits.clone(), meta_for(params, logits.shape[1], **kw))


def reference_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The spec, one row, by sorting: temperature, top_k, top_p (of the top-k mass), min_p."""
    probs = torch.softmax(row.double() / p.temperature, -1)
    sp, order = probs.sort(descending=True)
    keep = torch.ones_like(sp, dtype=torch.bool)
    if p.top_k > 0:
        keep[p.top_k:] = False
    kp = sp * keep / (sp * keep).sum()
    keep &= (kp.cumsum(0) - kp < p.top_p) | (p.top_p >= 1)
    keep &= sp >= p.min_p * sp[0]
    keep[0] = True
    out = torch.zeros_like(probs)
    out[order] = sp * keep
    return out / out.sum()


def test_greedy_is_argmax_and_mixed_batches_keep_it():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 1000, generator=g)
    out = sample(logits, [SamplingParams(temperature=0)] * 16)
    assert torch.equal(out.token_ids, logits.argmax(-1))
    assert out.logprobs is None and out.top_ids is None
    params = [SamplingParams(temperature=0) if i % 2 else SamplingParams(temperature=1.5) for i in range(16)]
    torch.manual_seed(0)
    out = sample(logits, params)
    assert torch.equal(out.token_ids[1::2], logits[1::2].argmax(-1))
    assert not torch.equal(out.token_ids[0::2], logits[0::2].argmax(-1))


def test_top_k_1_is_greedy_even_with_temperature():
    logits = torch.randn(32, 500, generator=torch.Generator().manual_seed(1))
    for seed in range(3):
        torch.manual_seed(seed)
        out = sample(logits, [SamplingParams(temperature=5.0, top_k=1)] * 32)
        assert torch.equal(out.token_ids, logits.argmax(-1))


def run_steps(params_row, seed, position, neighbours, steps=8, V=3000):
    """Tokens of one seeded row over several steps, placed at `position` among `neighbours`."""
    mine, theirs = torch.Generator().manual_seed(123), torch.Generator().manual_seed(456)
    gen = torch.Generator().manual_seed(seed)
    sampler, tokens = Sampler(), []
    for _ in range(steps):
        params = list(neighbours)
        params.insert(position, params_row)
        gens = [torch.Generator().manual_seed(100 + i) if p.seed is not None else None for i, p in enumerate(params)]
        gens[position] = gen
        logits = torch.randn(len(params), V, generator=theirs) * 2
        logits[position] = torch.randn(V, generator=mine) * 2
        tokens.append(int(sample(logits, params, sampler, gens=gens).token_ids[position]))
    return tokens


@pytest.mark.parametrize("row", [SamplingParams(temperature=1.0, seed=7),
                                 SamplingParams(temperature=0.8, top_p=0.9, seed=7),
                                 SamplingParams(temperature=0.8, top_k=50, min_p=0.05, seed=7)])
def test_seeded_row_is_reproducible_and_batch_invariant(row):
    alone = run_steps(row, 7, 0, [])
    assert alone == run_steps(row, 7, 0, [])
    neighbours = [SamplingParams(temperature=0), SamplingParams(top_k=700, seed=3),
                  SamplingParams(temperature=1.3, top_p=0.5), SamplingParams(min_p=0.1)]
    assert alone == run_steps(row, 7, 3, neighbours)
    assert alone == run_steps(row, 7, 1, neighbours[:2])
    assert len(set(alone)) > 1
    assert alone != run_steps(row, 8, 0, [])


# (params, num_candidates, wide_candidates): small candidate sets force the head/tail split and
# the wide and full-vocabulary nucleus stages
STAT_CASES = [
    (SamplingParams(temperature=0.7), 256, 4096),
    (SamplingParams(temperature=0.7), 2, 4),
    (SamplingParams(temperature=1.0, top_p=0.75), 256, 4096),
    (SamplingParams(temperature=1.0, top_p=0.75), 2, 3),
    (SamplingParams(temperature=1.0, top_p=0.75), 2, 2),
    (SamplingParams(temperature=1.2, top_k=4, top_p=0.8), 2, 2),
    (SamplingParams(temperature=1.0, min_p=0.1), 2, 2),
]


@pytest.mark.parametrize("params,num_candidates,wide", STAT_CASES)
def test_sampling_follows_filtered_softmax(params, num_candidates, wide):
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    n = 20000
    torch.manual_seed(0)
    out = sample(logits.expand(n, -1), [params] * n, Sampler(num_candidates, wide))
    freq = torch.bincount(out.token_ids, minlength=8).double() / n
    expected = reference_probs(logits, params)
    assert (freq - expected).abs().max() < 0.015  # ~4 sigma
    assert freq[expected == 0].sum() == 0


@pytest.mark.parametrize("num_candidates,wide", [(256, 4096), (8, 64), (8, 8)])
@pytest.mark.parametrize("params", [SamplingParams(top_k=5), SamplingParams(top_p=0.5),
                                    SamplingParams(min_p=0.2), SamplingParams(temperature=0.5, top_p=0.9, min_p=0.01)])
def test_filtered_tokens_are_never_sampled(params, num_candidates, wide):
    logits = torch.randn(64, 2000, generator=torch.Generator().manual_seed(2)) * 3
    allowed = torch.stack([reference_probs(row, params) > 0 for row in logits])  # [64, 2000]
    torch.manual_seed(0)
    for _ in range(5):
        out = sample(logits, [params] * 64, Sampler(num_candidates, wide))
        assert allowed.gather(1, out.token_ids[:, None]).all()


def test_penalties_follow_the_formulas():
    V = 10
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(3)) * 2
    logits[0, 1], logits[0, 2] = 1.5, -1.5
    params = [SamplingParams(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25),
              SamplingParams(presence_penalty=1.0),
              SamplingParams()]
    prompts, outputs = [[1, 2, 2, V + 1], [3], [4]], [[5, 5, 5, 1], [], [6]]  # V + 1: out of vocab, ignored
    got = logits.clone()
    apply_penalties(got, meta_for(params, V, prompts=prompts, outputs=outputs))
    want = logits.clone()
    for t in {1, 2, 5}:
        want[0, t] = want[0, t] / 1.5 if want[0, t] > 0 else want[0, t] * 1.5
    for t in {5, 1}:
        want[0, t] -= 0.5 + 0.25 * outputs[0].count(t)
    assert torch.allclose(got, want)
    assert got[0, 1] == pytest.approx(1.5 / 1.5 - 0.5 - 0.25) and got[0, 2] == pytest.approx(-2.25)
    assert not torch.equal(got[0], logits[0])


def test_min_tokens_bans_eos_and_stop_tokens():
    V = 50
    logits = torch.zeros(1, V)
    logits[0, 7], logits[0, 9], logits[0, 3] = 10.0, 9.0, 8.0  # 7 = eos, 9 = stop token
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9])
    assert sample(logits, [params], outputs=[[1]], eos=(7,)).token_ids.item() == 3
    assert sample(logits, [params], outputs=[[1, 2, 3]], eos=(7,)).token_ids.item() == 7
    ignore = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9], ignore_eos=True)
    assert sample(logits, [ignore], outputs=[[1]], eos=(7,)).token_ids.item() == 7
    hot = SamplingParams(temperature=1.0, min_tokens=2)
    torch.manual_seed(0)
    ids = sample(logits.expand(500, -1) * 3, [hot] * 500, outputs=[[]] * 500, eos=(7,)).token_ids
    assert not (ids == 7).any() and (ids == 9).any()


def test_logprobs_are_of_the_raw_logits():
    V = 300
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(4)) * 2
    params = [SamplingParams(temperature=0.5, logprobs=3, repetition_penalty=2.0),
              SamplingParams(temperature=0, logprobs=0),
              SamplingParams(temperature=1.0),
              SamplingParams(temperature=0, logprobs=5)]
    outputs = [[int(logits[0].argmax())], [], [], []]
    torch.manual_seed(0)
    out = sample(logits, params, outputs=outputs)
    lsm = torch.log_softmax(logits, -1)
    asked = [0, 1, 3]
    assert torch.allclose(out.logprobs[asked], lsm[asked].gather(1, out.token_ids[asked, None])[:, 0])
    assert torch.isnan(out.logprobs[2])
    assert out.top_ids.shape == (4, 5)
    order = lsm.argsort(-1, descending=True)
    assert torch.equal(out.top_ids[asked], order[asked, :5])
    assert torch.allclose(out.top_logprobs[asked], lsm[asked].gather(1, order[asked, :5]))
    assert (out.top_ids[2] == -1).all()
    assert out.logprobs[1] == pytest.approx(lsm[1].max().item())


def test_logit_bias_forces_bans_and_leaves_other_rows_alone():
    V = 500
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(5)) * 3
    top = logits.argmax(-1)
    low = logits.argmin(-1)
    plain = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0),
             SamplingParams(temperature=0.8, top_p=0.9, seed=2), SamplingParams(temperature=0),
             SamplingParams(temperature=1.0, top_k=20, seed=3)]
    biased = list(plain)
    biased[0] = SamplingParams(temperature=0, logit_bias={int(low[0]): 100})  # +100 forces the least likely
    biased[2] = SamplingParams(temperature=0, logit_bias={int(top[2]): -100})  # -100 bans the argmax
    biased[3] = SamplingParams(temperature=0.8, top_p=0.9, seed=2, logit_bias={int(low[3]): 100})

    def run(params):
        gens = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in params]
        return sample(logits, params, gens=gens).token_ids

    without, with_bias = run(plain), run(biased)
    assert with_bias[0] == low[0] and with_bias[3] == low[3]
    assert with_bias[2] != top[2] and with_bias[2] == logits[2].topk(2).indices[1]
    untouched = [1, 4, 5]  # same tokens as in a batch without any bias (seeded rows draw the same noise)
    assert torch.equal(with_bias[untouched], without[untouched])


def test_logit_bias_is_applied_on_the_all_greedy_fast_path():
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(6))
    params = [SamplingParams(temperature=0)] * 4
    params[1] = SamplingParams(temperature=0, logit_bias={7: 100, 8: -5})
    meta = meta_for(params, 300)
    assert not meta.fast_greedy
    out = Sampler()(logits.clone(), meta).token_ids
    assert out[1] == 7
    assert torch.equal(out[[0, 2, 3]], logits[[0, 2, 3]].argmax(-1))
    small = SamplingParams(temperature=0, logit_bias={int(logits[1].argsort()[-2]): 1e-3})
    assert sample(logits[1:2], [small]).token_ids[0] == logits[1].argmax()  # a small bias only nudges


def test_tiny_temperatures_are_greedy():
    from ridgeline.sampling_params import GREEDY_EPSILON
    logits = torch.randn(8, 400, generator=torch.Generator().manual_seed(7)) * 5
    for t in (1e-300, 1e-30, GREEDY_EPSILON / 2):
        params = [SamplingParams(temperature=t, seed=i) for i in range(8)]
        assert all(p.greedy for p in params)
        assert torch.equal(sample(logits, params).token_ids, logits.argmax(-1))
    assert not SamplingParams(temperature=GREEDY_EPSILON).greedy
    assert SamplingParams(top_p=0).greedy  # a nucleus of mass 0 keeps only the top token
