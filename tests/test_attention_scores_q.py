"""The "sdpa-scores-int8" backend (layers/attention_scores_q.py): attention with its softmax inputs
rounded to int8 per query row and head, for `eval --sweep`. The rounding is what it says, the engine
runs it in place of SDPA (as modules, never the C stack), and it costs a little, not nothing."""
import pytest
import torch

from ridgeline import LLM
from ridgeline.layers.attention_scores_q import quantize_scores


def test_scores_round_to_127_levels_of_the_row_max_over_allowed_keys():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 2, 5, 40, generator=g) * 4
    allowed = torch.rand(3, 1, 5, 40, generator=g) > 0.3
    s[0, 0, 0, 0] = 1e4  # a masked-off outlier must not set the scale of its row
    allowed[0, 0, 0, 0] = False
    allowed[1, 0, 2] = False  # a row with no key: left as it is
    got = quantize_scores(s.clone(), allowed)
    a = s.abs().masked_fill(~allowed, 0).amax(-1, keepdim=True) / 127
    on = allowed.expand_as(s)
    err = (got - s).abs()
    assert bool((err <= a / 2 + 1e-5).expand_as(s)[on].all()) and float(err[on].max()) > 0
    levels = (got / torch.where(a > 0, a, torch.ones_like(a)))
    assert torch.allclose(levels[on.expand_as(s)], levels[on.expand_as(s)].round(), atol=1e-3)
    assert float(levels.abs()[on].max()) <= 127 + 1e-3
    assert torch.equal(got[1, :, 2], s[1, :, 2])


@pytest.fixture(scope="module")
def models(tiny_llama):
    kw = dict(dtype="float32", kv_cache_memory="4MiB", progress=False)
    return LLM(str(tiny_llama), attention_backend="sdpa", **kw), LLM(str(tiny_llama),
                                                                        attention_backend="sdpa-scores-int8", **kw)


def test_engine_runs_it_as_modules_and_it_costs_a_little(models):
    ref, q = models
    assert all(p is not None and "sdpa-scores-int8" in p for p in q.info.layer_paths)
    ids = list(range(30, 110))
    want, got = ref.engine.prompt_logits(ids), q.engine.prompt_logits(ids)
    rel = float((got - want).abs().max() / want.abs().max())
    assert 0 < rel < 0.05, rel
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) > 0.9
