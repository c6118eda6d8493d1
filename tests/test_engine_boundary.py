"""The engine boundary: outputs are deltas (what is new since the request's last output), which
fold back into exactly the whole outputs; plans carry no live references into engine state."""
from __future__ import annotations

from ridgeline import LLM, SamplingParams
from ridgeline.engine.outputs import Accumulator

PROMPTS = ["Once upon a time", "The meaning of life is", "abc"]


def test_deltas_fold_into_the_whole_output(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", progress=False)
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2, n=2, seed=1),
              SamplingParams(temperature=0.8, seed=5, max_tokens=30, stop=["ee"], logprobs=0),
              SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=1)]
    whole = llm.generate(PROMPTS, params, use_tqdm=False)
    eng, acc = llm.engine, Accumulator()
    for i, (p, sp) in enumerate(zip(PROMPTS, params)):
        eng.add_request(f"r{i}", p, sp)
    seen: dict[tuple[str, int], int] = {}
    prompt_logprobs_sent = 0
    while eng.has_unfinished():
        for delta in eng.step():
            for c in delta.outputs:
                assert c.token_ids or c.text or c.finish_reason or c.logprobs, "an empty delta"
                seen[delta.request_id, c.index] = seen.get((delta.request_id, c.index), 0) + len(c.token_ids)
            prompt_logprobs_sent += delta.prompt_logprobs is not None
            acc.add(delta)
    assert prompt_logprobs_sent == 1  # once, when the prompt is scored
    for i, want in enumerate(whole):
        got = acc.outputs[f"r{i}"]
        assert got.finished
        assert [(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in got.outputs] == \
            [(c.index, c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in want.outputs]
        assert [[(lp.token_id, lp.logprob) for lp in c.logprobs or []] for c in got.outputs] == \
            [[(lp.token_id, lp.logprob) for lp in c.logprobs or []] for c in want.outputs]
        for c in want.outputs:
            assert seen.get((f"r{i}", c.index), 0) == len(c.token_ids)  # every token sent exactly once
    assert [lp and lp.logprob for lp in acc.outputs["r2"].prompt_logprobs] == \
        [lp and lp.logprob for lp in whole[2].prompt_logprobs]


def test_a_plan_holds_copies_not_engine_state(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", progress=False)
    eng = llm.engine
    eng.add_request("a", "hello there", SamplingParams(temperature=0, max_tokens=5, repetition_penalty=1.2))
    plan = eng.scheduler.schedule()
    [seq] = plan.seqs
    req = eng.requests["a"]
    assert seq.block_table is not eng.kv.tables["a"] and seq.block_table == eng.kv.tables["a"]
    assert seq.history is not req.token_ids and seq.history == req.token_ids
    seq.block_table.append(99)
    seq.history.append(7)
    assert 99 not in eng.kv.tables["a"] and 7 not in req.token_ids[-1:]
    eng.scheduler.advance()
    eng.abort_request("a")
    eng.kv.check_integrity()
