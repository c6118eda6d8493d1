"""The EAGLE head's context for prefix-cached positions (spec/eagle_context.py): a request whose prompt
the prefix cache serves gets the head fed from position 0, from the target's hidden rows kept beside
its KV blocks, and drafts what a fresh run drafts; rows whose slots hold other tokens are not read;
greedy output stays the plain engine's."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.speculative.eagle_context import HiddenRows

BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)
PROMPT = "The meaning of life is " * 3 + "and so on"  # several full KV blocks
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _recording(llm):
    """Record (every catch-up's fed positions, every propose()'s drafts) of llm's eagle proposer."""
    proposer = llm.engine.proposer
    impl = proposer._c or proposer
    fed, drafts = [], []
    catch_up, propose = impl.catch_up, proposer.propose

    def recording_catch_up(states):
        n, positions = catch_up(states)
        fed.append(list(positions))
        return n, positions

    def recording_propose(requests):
        out = propose(requests)
        drafts.append([list(d) for d in out])
        return out
    impl.catch_up, proposer.propose = recording_catch_up, recording_propose
    return fed, drafts


def _run(llm, fed, drafts):
    fed.clear()
    drafts.clear()
    out = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0]
    return out, [p for f in fed for p in f], [d for d in drafts if any(d)]


def test_a_prefix_cache_hit_drafts_as_a_fresh_run(tiny_llama, tiny_head):
    kw = dict(speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              speculative_controller="off", **BASE)
    plain = LLM(str(tiny_llama), **BASE).generate([PROMPT], PARAMS, use_tqdm=False)[0].outputs[0].token_ids
    llm = LLM(str(tiny_llama), **kw)
    assert llm.engine.proposer.context is not None
    fed, drafts = _recording(llm)
    first, fed1, drafts1 = _run(llm, fed, drafts)
    again, fed2, drafts2 = _run(llm, fed, drafts)
    assert again.num_cached_tokens >= 16 and not first.num_cached_tokens  # the rerun's prompt came from the cache
    assert fed2[:again.num_cached_tokens] == list(range(again.num_cached_tokens))  # fed from position 0
    assert fed2 == fed1 and drafts2 == drafts1 and drafts1
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == plain


def test_rows_of_other_tokens_are_not_read(tiny_llama, tiny_head):
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              speculative_controller="off", **BASE)
    plain = LLM(str(tiny_llama), **BASE).generate([PROMPT], PARAMS, use_tqdm=False)[0].outputs[0].token_ids
    fed, drafts = _recording(llm)
    _run(llm, fed, drafts)
    llm.engine.proposer.context.tokens[:] = -1  # as if no row had been written (a block from an offload tier)
    again, fed2, _ = _run(llm, fed, drafts)
    assert again.num_cached_tokens >= 16 and fed2[0] == again.num_cached_tokens  # the cached positions skipped
    assert again.outputs[0].token_ids == plain


def test_no_rows_without_prefix_caching(tiny_llama, tiny_head):
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              enable_prefix_caching=False, **BASE)
    assert llm.engine.proposer.context is None
    assert "prefix-cached" not in llm.engine.proposer.summary()


def test_hidden_rows_land_at_their_slots():
    ctx = HiddenRows(num_blocks=4, block_size=4, hidden_size=3, dtype=torch.float32, device=torch.device("cpu"))
    table = [2, 0, 3]  # positions 0-3 in block 2, 4-7 in block 0, 8-11 in block 3
    hidden = torch.arange(30, dtype=torch.float32).reshape(10, 3)
    ctx.write(table, 2, hidden, 1, [10, 11, 12, 13, 14, 15, 16])  # positions 2..8 <- rows 1..7
    slots = [2 * 4 + 2, 2 * 4 + 3, 0, 1, 2, 3, 3 * 4]
    assert ctx.tokens[slots].tolist() == [-1] * 7  # queued: a step's rows land together
    ctx.write(table, 9, hidden, 9, [17])  # a decode row: position 9 <- row 9
    ctx.flush()
    assert torch.equal(ctx.rows[slots + [13]], hidden[[1, 2, 3, 4, 5, 6, 7, 9]]) and ctx.tokens[13] == 17
    assert ctx.tokens[slots].tolist() == [10, 11, 12, 13, 14, 15, 16]
    tokens = [8, 9, 10, 11, 12, 13, 14]
    assert ctx.runs(table, 2, tokens) is None  # positions 0, 1 were never written
    ctx.write(table, 0, hidden, 0, [8, 9])
    assert ctx.runs(table, 7, tokens) == [(0, 8, 4), (4, 0, 3)]  # reading flushes what is queued
    ctx.rows.zero_()
    wide = hidden.to(torch.float64)  # another dtype (as a GPU's rows): queued, then copied by torch in one op
    ctx.write(table, 0, wide, 0, [8, 9])
    ctx.write(table, 4, wide, 5, [20, 21, 22])
    assert not ctx.rows.any()
    ctx.flush()
    assert torch.equal(ctx.rows[[8, 9, 0, 1, 2]], hidden[[0, 1, 5, 6, 7]])
    assert np.array_equal(ctx.tokens[0:3], [20, 21, 22])
    ctx.write(table, 0, wide, 0, [8, 9])
    ctx.write(table, 2, hidden.to(torch.float64), 3, [1, 2])  # another step's rows: the queued ones land first
    ctx.flush()
    assert torch.equal(ctx.rows[[8, 9, 10, 11]], hidden[[0, 1, 3, 4]])


def test_a_reused_request_id_gets_a_fresh_head_state(tiny_llama, tiny_head):
    """A finished request's head state goes before the step's new rows are kept: a new request under
    the same id, added before that step, keeps the rows of its own prompt."""
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              speculative_controller="off", enable_prefix_caching=False, **BASE)
    eng, (fed, _) = llm.engine, _recording(llm)
    for _ in range(2):
        fed.clear()
        eng.add_request("same", PROMPT, PARAMS)
        while eng.has_unfinished():
            eng.step()
        assert [p for f in fed for p in f][:3] == [0, 1, 2]
