"""The `draft` proposer: a second model (or the target's own weights, quantized) drafts with its own
paged KV cache. Greedy output is token for token the plain engine's through chunked prefill,
prefix caching and forced preemption, the draft's KV books balance, and a draft that cannot stand in
for the target is an error at start-up."""
from __future__ import annotations

import pytest

from conftest import VOCAB, make_tiny_model
from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError
from test_multi_token_steps import OPTS, _params, _run, same_as_plain

BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """Another model with the tiny llama's tokenizer: one layer, other weights."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-draft"), "llama", seed=1, num_hidden_layers=1)


CASES = [("other", o) for o in OPTS] + [("self", "chunked"), ("self-int4", "preempt")]


@pytest.mark.parametrize("draft,opts", CASES, ids=[f"{d}-{o}" for d, o in CASES])
def test_greedy_output_is_the_plain_engines(tiny_llama, other_draft, draft, opts):
    kw = {**BASE, **OPTS[opts]}
    params = _params()
    plain = _run(LLM(str(tiny_llama), **kw), params)
    model = str(other_draft) if draft == "other" else "self"
    llm = LLM(str(tiny_llama), speculative_method="draft", draft_model=model, num_speculative_tokens=3,
              draft_quantization="int4" if draft == "self-int4" else "none", speculative_controller="off", **kw)
    assert "draft model" in llm.info.summary()
    stats = same_as_plain(llm, params, plain, opts)  # a prefix-cache rerun: the draft catches up on its own
    if draft == "self":  # the target's own weights: (nearly) every draft is the target's choice
        assert stats.accepted >= 0.9 * stats.proposed
    llm.engine.step()  # per-request state of finished requests goes at the next step, the draft's blocks too
    proposer = llm.engine.proposer
    assert not proposer.fed and proposer.kv.num_free_blocks == proposer.kv.num_usable_blocks
    proposer.kv.check_integrity()


def test_sampled_requests_stay_seeded_and_reproducible(tiny_llama):
    kw = dict(BASE, speculative_method="draft", draft_model="self", draft_quantization="int8",
              speculative_controller="off")
    params = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=24, seed=7, ignore_eos=True)
    prompts = ["abc abc abc", "one two three"]
    runs = []
    for _ in range(2):
        llm = LLM(str(tiny_llama), **kw)
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        assert llm.engine.spec_stats.accepted > 0
    assert runs[0] == runs[1] and all(len(t) == 24 for t in runs[0])


def test_bad_draft_configuration_is_a_start_up_error(tiny_llama, tmp_path):
    wide = make_tiny_model(tmp_path / "wide", "llama", vocab_size=VOCAB + 16)
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        LLM(str(tiny_llama), speculative_method="draft", draft_model=str(wide), **BASE)
    short = make_tiny_model(tmp_path / "short", "llama", max_position_embeddings=128)
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        LLM(str(tiny_llama), speculative_method="draft", draft_model=str(short), **BASE)
    with pytest.raises(InvalidRequestError, match="needs draft_model"):
        LLM(str(tiny_llama), speculative_method="draft", **BASE)
    with pytest.raises(InvalidRequestError, match="needs draft_model"):
        LLM(str(tiny_llama), speculative_method="ngram", draft_model="self", **BASE)
    with pytest.raises(InvalidRequestError, match="draft_quantization"):
        LLM(str(tiny_llama), speculative_method="draft", draft_model="self", draft_quantization="int3", **BASE)


def test_a_prompt_catch_up_is_reported_as_setup_time(tiny_llama):
    """The draft's first pass over a new request's prompt is a one-time cost (the controller pays it
    from its probe budget, not from the per-position draft cost); a steady step's first pass is not."""
    llm = LLM(str(tiny_llama), speculative_method="draft", draft_model="self", draft_quantization="int8",
              speculative_controller="off", **BASE)
    proposer, propose, setup = llm.engine.proposer, llm.engine.proposer.propose, []

    def recording(reqs):
        out = propose(reqs)
        setup.append(proposer.setup_time)
        return out
    proposer.propose = recording
    llm.generate(["The meaning of life is " * 3], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                 use_tqdm=False)
    assert setup[0] > 0 and len(setup) >= 2 and all(t == 0 for t in setup[1:])


def test_backlog_counts_the_tokens_the_draft_has_not_computed(tiny_llama, other_draft):
    llm = LLM(str(tiny_llama), speculative_method="draft", draft_model=str(other_draft), num_speculative_tokens=2,
              speculative_controller="off", **BASE)
    eng, prop = llm.engine, llm.engine.proposer
    eng.add_request("b", list(range(5, 25)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    eng.step(emit_unfinished=False)  # prefill (the draft drafts from the next step on)
    n = eng.requests["b"].num_tokens
    assert prop.backlog("b", n) == n
    eng.step(emit_unfinished=False)
    assert prop.setup_rows == n - 3 and prop.backlog("b", eng.requests["b"].num_tokens) <= 3
