"""The "flash" backend's packing (keys gathered per sequence, cumulative counts, bottom-right causal
mask, sliding window) run on a CPU through its torch reference: greedy output and logprobs equal
the C kernel's and SDPA's, with chunked prefill, prefix-cache hits and a sliding window."""
import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError
from ridgeline.layers import attention_flash

PROMPTS = ["shared system prompt, then a question " * 3 + str(i) for i in range(4)] + ["a", "The quick brown fox " * 5]


@pytest.fixture
def flash_on_cpu(monkeypatch):
    monkeypatch.setattr(attention_flash.FlashVarlen, "unsupported", staticmethod(lambda kv, plan: None))


def _run(folder, **kw):
    llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", max_num_batched_tokens=24, progress=False, **kw)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=1)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)  # long enough to slide a 24-token window
    outs += llm.generate(PROMPTS[:2], params, use_tqdm=False)  # prefix-cache hits
    return llm, [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outs]


def test_flash_packing_matches_the_other_backends(tiny_model, flash_on_cpu):
    _, folder = tiny_model
    llm, flash = _run(folder, attention_backend="flash")
    assert llm.engine.runner.model.model.layers[0].self_attn.attn.backend.name == "flash"
    _, c = _run(folder)
    _, sdpa = _run(folder, attention_backend="sdpa")
    for (ft, fl), (ct, cl), (st, _) in zip(flash, c, sdpa):
        assert ft == ct == st
        assert max(abs(a - b) for a, b in zip(fl, cl)) < 1e-3


def test_flash_says_why_it_cannot_run_here(tiny_llama):
    with pytest.raises(InvalidRequestError, match="CUDA"):
        LLM(str(tiny_llama), dtype="float32", kv_cache_memory="4MiB", attention_backend="flash", progress=False)


def test_reference_is_bottom_right_causal_with_a_window():
    torch.manual_seed(0)
    H, Hkv, D = 4, 2, 8
    q, k, v = torch.randn(3, H, D), torch.randn(7, Hkv, D), torch.randn(7, Hkv, D)
    cu_q, cu_k = torch.tensor([0, 3]), torch.tensor([0, 7])
    out = attention_flash.varlen_reference(q, k, v, cu_q, cu_k, 0.5, window=3)
    # the last query sits at position 6 and sees keys 4, 5, 6 only
    kk, vv = k[4:7].repeat_interleave(2, 1), v[4:7].repeat_interleave(2, 1)
    p = torch.softmax(torch.einsum("hd,lhd->hl", q[2], kk) * 0.5, -1)
    assert torch.allclose(out[2], torch.einsum("hl,lhd->hd", p, vv), atol=1e-6)
