"""A constrained greedy row takes the fused LM head + argmax C call: its token is the argmax over the
tokens its structured-output mask allows, the same token the full path (logits, mask to -inf,
torch.argmax) picks, ties, NaNs and an all -inf row included; and a constrained greedy step no longer
builds the sampler's logits."""
from __future__ import annotations

import random

import pytest
import torch

from ridgeline.kernels import cpu_ops
from ridgeline.layers.sampler import _allowed, apply_allowed
from ridgeline.sampling_params import SamplingParams
from ridgeline.structured_params import StructuredOutputs

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="no C kernels")


def _bits(allowed: list[int], V: int) -> bytes:
    words = [0] * ((V + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return b"".join(w.to_bytes(4, "little") for w in words)


def _head(W: torch.Tensor, x: torch.Tensor, masks: list[bytes | None]):
    """(the C call's logits, its choices) for W [N, K], x [M, K], one mask (or None) per row."""
    from ridgeline.kernels import cpu_stack
    from ridgeline.kernels.cpu_gemm import PackedWeight
    from ridgeline.layers.weight_formats import C_F32_PACKED
    from ridgeline.models.llama import _mask_rows
    packed = PackedWeight(W)
    desc = torch.tensor([C_F32_PACKED, packed.data.data_ptr(), 0, 0], dtype=torch.int64)
    y, ids = torch.empty(x.shape[0], W.shape[0]), torch.empty(x.shape[0], dtype=torch.int64)
    cpu_stack.linear_argmax(desc, x, y, ids, *_mask_rows(masks, x.shape[0], W.shape[0]))
    return y, ids


def _reference(y: torch.Tensor, masks: list[bytes | None]) -> list[int]:
    """The full path: every forbidden token -inf (the sampler's own apply_allowed), then torch.argmax."""
    y = y.clone()
    rows = [i for i, m in enumerate(masks) if m is not None]
    if rows:
        rows_t, words = _allowed(masks, y.shape[1], y.device)
        assert rows_t.tolist() == rows
        apply_allowed(y, (rows_t, words))
    return y.argmax(-1).tolist()


@pytest.mark.parametrize("N", [100, 129, 1000])
def test_masked_argmax_is_the_masked_logits_argmax(N):
    rng = random.Random(N)
    K, M = 24, 12
    W, x = torch.randn(N, K), torch.randn(M, K)
    W[N - 1] = W[N // 2] = W[3] = 10 * x[0]  # row 0's largest logits, tied three ways
    dense = [t for t in range(N) if rng.random() < 0.9]
    masks = [_bits([3, N // 2, N - 1], N), _bits([N // 2, N - 1], N), _bits([N - 1], N), None,
             _bits(dense, N), _bits(rng.sample(range(N), 5), N), _bits([0], N), _bits(list(range(N)), N),
             None, _bits(list(range(17, 31)), N), _bits(list(range(16, 48)), N), _bits([], N)]
    y, ids = _head(W, x, masks)
    assert ids.tolist() == _reference(y, masks)
    assert ids[0] == 3 and ids[1] == N // 2 and ids[2] == N - 1  # ties: the first allowed maximum
    for m, t in zip(masks, ids.tolist()):
        if m is not None and any(m):
            assert m[t // 8] >> (t % 8) & 1, "an allowed token"
    _, plain = _head(W, x, [None] * M)
    assert plain.tolist() == y.argmax(-1).tolist()  # unmasked rows as before


def test_masked_argmax_nans_and_infinities():
    N, K = 200, 8
    W, x = torch.randn(N, K), torch.randn(4, K)
    W[150] = float("nan")  # every row's logit 150 is NaN
    W[40] = W[41] = float("inf") * torch.sign(x[0])  # row 0: +inf at 40 and 41
    masks = [_bits([41, 40, 7], N), _bits([150, 2], N), _bits([7, 150, 199], N), _bits([3, 9], N)]
    y, ids = _head(W, x, masks)
    assert ids.tolist() == _reference(y, masks) == [40, 150, 150, ids[3].item()]
    W2 = torch.full((N, K), 0.0)
    W2[5:] = float("-inf")  # logits 5.. are -inf (x row has a positive entry)
    x2 = torch.ones(1, K)
    y, ids = _head(W2, x2, [_bits([60, 70], N)])  # every allowed logit -inf: the masked row is all -inf
    assert ids.tolist() == _reference(y, [_bits([60, 70], N)]) == [0]


def test_constrained_greedy_step_takes_the_fused_head(tiny_llama, monkeypatch):
    import json

    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.runner import step_sampler
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["color", "n"], "additionalProperties": False}
    assert SamplingParams(temperature=0, max_tokens=8, structured=StructuredOutputs(json=json.dumps(schema))
                          ).masked_argmax
    outs = {}
    for fused in (True, False):
        eng = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, dtype="float32",
                                                 kv_cache_memory="8MiB"))
        calls = []
        real = step_sampler.StepSampler.__call__
        monkeypatch.setattr(step_sampler.StepSampler, "__call__",
                            lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
        if not fused:
            monkeypatch.setattr(eng.runner.model, "greedy_tokens", lambda *a, **k: None)
        for i in range(3):
            eng.add_request(str(i), f"Reply {i}: ", SamplingParams(
                temperature=0, max_tokens=40, structured=StructuredOutputs(json=json.dumps(schema))))
        eng.add_request("plain", "Reply: ", SamplingParams(temperature=0, max_tokens=10))
        got = {}
        while eng.has_unfinished():
            for o in eng.step(emit_unfinished=False):
                got[o.request_id] = (o.outputs[0].text, list(o.outputs[0].token_ids))
        outs[fused] = got
        assert bool(calls) != fused  # the fused path never builds the sampler's logits
        monkeypatch.undo()
    assert outs[True] == outs[False]
    for i in range(3):
        value = json.loads(outs[True][str(i)][0])
        assert value["color"] in ("red", "green", "blue") and 0 <= value["n"] <= 99
