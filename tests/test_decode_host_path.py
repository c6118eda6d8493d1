"""The host side of a small decode step, kept lean (a step's host work runs on caches the decoder
stack's weight stream has just flushed): the plain-Python preparation of a few decodes (and
verifications of drafted tokens, and chunks past the prompt) builds exactly what the general path builds, the C embedding lookup is torch's, and the step sampler's argmax
shortcut is taken only where the sampler would take the argmax itself."""
from __future__ import annotations

import random

import pytest
import torch

from ridgeline.kernels import cpu_ops
from ridgeline.runner import model_runner
from ridgeline.runner.model_runner import ModelRunner
from ridgeline.sampling_params import SamplingParams
from ridgeline.step_plan import ScheduledSeq

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def _runner(block_size: int) -> ModelRunner:
    r = ModelRunner.__new__(ModelRunner)  # only what _prepare reads
    r.block_size, r.device, r.kv_groups = block_size, torch.device("cpu"), 1
    return r


def _decodes(rng: random.Random, n: int, block_size: int, verify: int = 0) -> list[ScheduledSeq]:
    """n decodes, then `verify` sequences past their prompts with several new tokens (drafts to verify,
    or a recomputed chunk of outputs)."""
    seqs = []
    for i in range(n + verify):
        prompt = rng.randint(1, 40)
        start = prompt + rng.randint(0, 50)  # tokens cached before this step (past the prompt)
        new = 1 if i < n else rng.randint(2, 6)
        spec = rng.randint(0, new - 1) if i >= n else 0
        evicted = rng.random() < 0.3  # KV eviction: the new tokens' slots come after the kept tokens
        cache_start = rng.randint(1, start) if evicted else None
        slots = (cache_start if evicted else start) + new
        table = rng.sample(range(1, 500), -(-slots // block_size) + rng.randint(0, 2))  # may hold spare blocks
        seqs.append(ScheduledSeq(f"r{i}", start, [rng.randrange(1000) for _ in range(new)], table,
                                 rng.random() < 0.8, GREEDY, None, None, prompt, num_spec=spec,
                                 cache_start=cache_start))
    return seqs


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif hasattr(a, "__dataclass_fields__"):
        for name in a.__dataclass_fields__:
            _same(getattr(a, name), getattr(b, name))
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif hasattr(a, "dtype"):  # numpy
        assert a.dtype == b.dtype and (a == b).all()
    else:
        assert a == b


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_small_step_preparation_builds_what_the_general_path_builds(block_size, monkeypatch):
    rng = random.Random(block_size)
    runner = _runner(block_size)
    for n, verify in ((1, 0), (2, 0), (5, 0), (model_runner.SMALL_DECODE, 0), (0, 1), (0, 3), (2, 2), (7, 9)):
        seqs = _decodes(rng, n, block_size, verify)
        fast = runner.prepare(seqs)
        monkeypatch.setattr(model_runner, "SMALL_DECODE", 0)
        general = runner.prepare(seqs)
        monkeypatch.undo()
        _same(fast, general)


def test_a_step_with_a_prompt_chunk_takes_the_general_path(monkeypatch):
    rng = random.Random(0)
    seqs = _decodes(rng, 2, 16)
    seqs.append(ScheduledSeq("p", 0, [5, 6, 7], [9], True, GREEDY, None, None, 3))
    called = []
    monkeypatch.setattr(ModelRunner, "_prepare_small", lambda self, s: called.append(s))
    _runner(16).prepare(seqs)
    assert not called


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_c_embedding_lookup_is_torchs(dtype):
    if not cpu_ops.available():
        pytest.skip("no C kernels")
    table = (torch.randn(300, 72) * 3).to(dtype)
    ids = torch.tensor([0, 299, 17, 17, 150])
    assert torch.equal(cpu_ops.embed(table, ids), torch.nn.functional.embedding(ids, table).float())
    assert torch.equal(cpu_ops.embed(table, ids[1::2]), torch.nn.functional.embedding(ids[1::2], table).float())
    for bad in (300, -1):
        with pytest.raises(IndexError, match="300 rows"):
            cpu_ops.embed(table, torch.tensor([3, bad]))


@pytest.mark.parametrize("change", [dict(repetition_penalty=1.2), dict(presence_penalty=0.5),
                                    dict(frequency_penalty=0.5), dict(logit_bias={3: 5.0}), dict(min_tokens=2),
                                    dict(logprobs=1), dict(temperature=0.7)])
def test_plain_greedy_excludes_everything_that_moves_the_argmax_or_asks_for_more(change):
    assert GREEDY.plain_greedy and SamplingParams(top_k=1, max_tokens=4).plain_greedy
    assert not SamplingParams(**{"temperature": 0, "max_tokens": 8, **change}).plain_greedy


def _argmax_head(W: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the C head's logits, its choices, the packed fp32 weight's own matmul) for W [N, K], x [M, K]."""
    from ridgeline.kernels import cpu_stack
    from ridgeline.kernels.cpu_gemm import PackedWeight
    from ridgeline.layers.weight_formats import C_F32_PACKED
    packed = PackedWeight(W)
    desc = torch.tensor([C_F32_PACKED, packed.data.data_ptr(), 0, 0], dtype=torch.int64)
    y, ids = torch.empty(x.shape[0], W.shape[0]), torch.empty(x.shape[0], dtype=torch.int64)
    cpu_stack.linear_argmax(desc, x, y, ids)
    return y, ids, packed(x)


def test_c_argmax_is_torchs_with_ties_and_nans():
    if not cpu_ops.available():
        pytest.skip("no C kernels")
    K, N = 24, 100
    W = torch.randn(N, K)
    x = torch.randn(6, K)
    W[37] = W[5] = 10 * x[0]  # row 0's largest logits, tied at 5 and 37: the first wins
    x[2] = 0.0  # every logit 0: index 0
    y, ids, ref = _argmax_head(W, x)
    assert torch.equal(y, ref) and torch.equal(ids, ref.argmax(-1))
    assert ids[0] == 5 and y[0, 5] == y[0, 37] and ids[2] == 0
    for nan_at in ([3], [70, 9], [99], [0]):  # a NaN wins, the first one where there are several
        Wn = W.clone()
        Wn[nan_at] = float("nan")
        y, ids, ref = _argmax_head(Wn, x)
        assert ids.tolist() == [min(nan_at)] * 6 == ref.argmax(-1).tolist()


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_greedy_head_picks_what_the_logits_pick(tiny_llama, quantization):
    from ridgeline import LLM
    llm = LLM(str(tiny_llama), dtype="float32", quantization=quantization, max_model_len=256)
    model = llm.engine.runner.model if hasattr(llm, "engine") else llm._engine.runner.model
    hidden = torch.randn(5, model.cfg.hidden_size) * 3
    tokens = model.greedy_tokens(hidden)
    assert tokens is not None, "the tiny model's head runs in C"
    assert tokens == model.compute_logits(hidden).argmax(-1).tolist()
    assert model.greedy_tokens(hidden[:1]) == tokens[:1]  # a row's choice does not depend on the others
