"""Requests aborted mid-generation (a client gone) under speculation: the draft model's own KV blocks
and the EAGLE head's pool blocks all come back, no per-request proposer state is left, the target's
KV books balance, and the engine runs on."""
from __future__ import annotations

import pytest

from conftest import make_tiny_model
from ridgeline import LLM, SamplingParams

BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False, num_speculative_tokens=3,
            speculative_controller="off")


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-abort-draft"), "llama", seed=1, num_hidden_layers=1)


def _free(prop) -> int:
    """The proposer's own free blocks: the draft model's KV cache, or the EAGLE head's C pool."""
    return prop.kv.num_free_blocks if hasattr(prop, "kv") else len(prop.head.stack.free)


@pytest.mark.parametrize("method", ["draft", "eagle"])
def test_aborted_requests_give_back_what_their_drafts_held(tiny_llama, tiny_head, one_layer, method):
    draft = one_layer if method == "draft" else tiny_head
    llm = LLM(str(tiny_llama), speculative_method=method, draft_model=str(draft), **BASE)
    eng, prop = llm.engine, llm.engine.proposer
    free = _free(prop)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(6):
        eng.add_request(f"r{i}", [5 + i, 6, 7, 8, 9, 10] * 3, params)
    for _ in range(5):
        eng.step()
    assert _free(prop) < free and eng.spec_stats.proposed > 0  # the drafts hold blocks now
    for i in range(0, 6, 2):  # some while the others go on, then the rest
        eng.abort_request(f"r{i}")
    for _ in range(3):
        eng.step()
    for i in range(1, 6, 2):
        eng.abort_request(f"r{i}")
    eng.step()
    assert not eng.has_unfinished() and not getattr(prop, "states", None) and not getattr(prop, "fed", None)
    assert _free(prop) == free and eng.kv.num_free_blocks == eng.kv.num_usable_blocks
    out = llm.generate(["The quick brown fox"], params, use_tqdm=False)[0]  # and it runs on
    eng.step()  # a finished request's proposer state goes at the next step
    assert len(out.outputs[0].token_ids) == 40 and _free(prop) == free
