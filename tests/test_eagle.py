"""The `eagle` proposer and `ridgeline train-draft` on a tiny model: a head trained for a few steps
loads and drafts; greedy output is token for token the plain engine's through chunked prefill,
prefix caching and forced preemption; the head is fed exactly the pairs (target hidden state at j,
token j+1) of verified positions; its cached drafting path is its training path; a head for another
model is an error at start-up."""
from __future__ import annotations

import ctypes
import json

import pytest
import torch

from conftest import make_tiny_model
from ridgeline import LLM, SamplingParams
from ridgeline.errors import InvalidRequestError
from ridgeline.speculative.eagle_head import EagleHead, HeadConfig
from test_multi_token_steps import OPTS, _params, _run, same_as_plain

BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)


def test_train_draft_writes_a_head_naming_its_target(tiny_head):
    config = json.loads((tiny_head / "config.json").read_text())
    assert config["target"]["architecture"] == "LlamaForCausalLM" and config["target"]["vocab_size"] == 384
    assert len(config["target"]["embedding_sha256"]) == 64
    assert "--seed 3" in config["training"]["command"] and config["training"]["tokens"] >= 2500
    from safetensors.torch import load_file
    tensors = load_file(str(tiny_head / "head.safetensors"))
    assert tensors["vocab_ids"].numel() == 200 and tensors["fc.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("opts", list(OPTS), ids=list(OPTS))
def test_greedy_output_is_the_plain_engines(tiny_llama, tiny_head, opts):
    kw = {**BASE, **OPTS[opts]}
    params = _params()
    plain = _run(LLM(str(tiny_llama), **kw), params)
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              speculative_controller="off", **kw)
    same_as_plain(llm, params, plain, opts)  # a prefix-cache rerun: the head drafts without the skipped positions
    llm.engine.step()  # per-request state of finished requests goes at the next step
    assert not llm.engine.proposer.states


def test_a_bf16_head_drafts_in_torch(tiny_llama, tiny_head, monkeypatch):
    """As on a GPU: bf16 activations and no C kernels, so the head, its copy pointer and the pick run
    in torch in bf16 (the pointer's fp32 inputs and the pick's scratch meet bf16 weights there).
    Greedy output is the plain engine's; a request that samples drafts too."""
    import dataclasses

    import ridgeline.engine.build as build
    from ridgeline.layers.kernel_plan import KernelPlan
    monkeypatch.setattr(build, "choose_kernels", lambda *a: KernelPlan())
    target = build.DraftTarget
    monkeypatch.setattr(build, "DraftTarget",
                        lambda *a, **k: dataclasses.replace(target(*a, **k), act_dtype=torch.bfloat16))
    kw = dict(BASE, dtype="bfloat16")
    params = _params() + [SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)]
    prompts = ["one two three one two three one two", "The quick brown fox"]
    plain = LLM(str(tiny_llama), **kw).generate(prompts, params[:2], use_tqdm=False)
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              speculative_controller="off", **kw)
    prop = llm.engine.proposer
    assert prop._c is None and prop.head.fc.weight.dtype == torch.bfloat16 and prop.pointer is not None
    out = llm.generate(prompts, params[:2], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in plain]
    assert llm.engine.spec_stats.proposed > 0
    proposed = llm.engine.spec_stats.proposed
    llm.generate(prompts[1:], params[-1:], use_tqdm=False)
    assert llm.engine.spec_stats.proposed > proposed


def test_the_head_reads_verified_pairs(tiny_llama, tiny_head):
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              speculative_controller="off", enable_prefix_caching=False, **BASE)
    proposer, fed = llm.engine.proposer, []
    impl = proposer._c or proposer  # the C path (spec/eagle_fast.py) or torch's
    catch_up = impl.catch_up
    # what the catch-up feeds rows through: the C step (hidden rows by address, tokens by id) or torch's
    c_path = proposer._c is not None
    owner = proposer.head.stack if c_path else proposer.head
    name = "step_ids" if c_path else "step" if proposer.pointer is None else "step_pointer"
    H = llm.engine.runner.model.cfg.hidden_size

    def recording(states):
        real = getattr(owner, name)

        def step(*args):
            if c_path:  # rows, ids, own, table, table format, positions, caches, counts, dst
                rows, ids, positions = args[0], args[1], args[5]
                hidden = torch.stack([torch.frombuffer((ctypes.c_float * H).from_address(p), dtype=torch.float32)
                                      for p in rows]).clone()
                fed.append((hidden, llm.engine.runner.model.model.embed(torch.tensor(ids)), torch.tensor(positions)))
            else:  # hidden, emb, (own embeddings,) positions, caches, counts
                fed.append((args[0].clone(), args[1].clone(), args[-3].clone()))
            return real(*args)
        setattr(owner, name, step)
        try:
            return catch_up(states)
        finally:
            delattr(owner, name)
    impl.catch_up = recording
    out = llm.generate(["The quick brown fox"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                       use_tqdm=False)[0]
    tokens = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    hidden, emb, pos = (torch.cat(x) for x in zip(*fed))
    m = len(pos)
    assert pos.tolist() == list(range(m)) and len(out.prompt_token_ids) - 1 <= m < len(tokens)
    ref = llm.engine.prompt_hidden(tokens)
    assert torch.allclose(hidden, ref[:m], atol=1e-4)
    model = llm.engine.runner.model.model
    dev = model.embed_tokens.weight.device  # the target's device (the C path's rows were made there too)
    assert torch.equal(emb.to(dev), model.embed(torch.tensor(tokens[1:m + 1], device=dev)))


def test_drafting_path_is_the_training_path():
    """Chunks of new positions against the cache, through both attention paths (by hand up to
    SMALL_QUERIES queries, SDPA above), agree with the whole-sequence pass."""
    from ridgeline.speculative.eagle_head import SMALL_QUERIES
    torch.manual_seed(0)
    head = EagleHead(HeadConfig(32, 4, 2, 8, 64, 1e-5, 10000.0)).eval()
    chunks = [4, 7, SMALL_QUERIES + 4, 1, SMALL_QUERIES]
    T = sum(chunks)
    h, e = torch.randn(T, 32), torch.randn(T, 32)
    with torch.no_grad():
        whole = head(h, e, torch.arange(T))
        short = head(h[:11], e[:11], torch.arange(11))
        caches, rows, at = [head.empty_cache()], [], 0
        for n in chunks:
            f, caches = head.step(h[at:at + n], e[at:at + n], torch.arange(at, at + n), caches, [n])
            rows.append(f)
            at += n
    assert torch.allclose(torch.cat(rows), whole, atol=1e-5)
    assert torch.allclose(short, whole[:11], atol=1e-5)


def test_one_position_at_a_time_is_the_training_path():
    """Drafting steps of one row (no mask is built) agree with the whole-sequence pass; the rotary
    table is derived from the config, not saved with the weights."""
    torch.manual_seed(1)
    head = EagleHead(HeadConfig(32, 4, 2, 8, 64, 1e-5, 10000.0)).eval()
    h, e = torch.randn(6, 32), torch.randn(6, 32)
    with torch.no_grad():
        whole = head(h, e, torch.arange(6))
        cache, rows = head.empty_cache(), []
        for j in range(6):
            f, (cache,) = head.step(h[j:j + 1], e[j:j + 1], torch.tensor([j]), [cache], [1])
            rows.append(f)
    assert torch.allclose(torch.cat(rows), whole, atol=1e-5)
    assert "inv_freq" not in head.state_dict()


def test_unrolled_training_is_the_drafted_chain():
    """Training's unrolled pass (two sequences packed together, three draft positions deep) gives,
    at every row, the feature that drafting computes: the cache fed from the target's hidden states
    up to the chain's start, then each draft from the head's own previous feature."""
    torch.manual_seed(2)
    head = EagleHead(HeadConfig(32, 4, 2, 8, 64, 1e-5, 10000.0)).eval()
    lens = (9, 7)
    h, e = torch.randn(sum(lens), 32), torch.randn(sum(lens), 32)
    pos = torch.cat([torch.arange(n) for n in lens])
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    with torch.no_grad():
        feats = head.unrolled(h, e, pos, seq, 3)
        assert torch.allclose(feats[0], torch.cat([head(h[:9], e[:9], pos[:9]), head(h[9:], e[9:], pos[9:])]),
                              atol=1e-5)
        checked = 0
        for off, n in ((0, 9), (9, 7)):
            hs, es = h[off:off + n], e[off:off + n]
            for b in range(n - 2):  # a chain whose first draft reads position b
                f, caches = head.step(hs[:b + 1], es[:b + 1], torch.arange(b + 1), [head.empty_cache()], [b + 1])
                f = f[-1:]
                for s in (2, 3):
                    j = b + s - 1
                    if j >= n:
                        break
                    f, caches = head.step(f, es[j:j + 1], torch.tensor([j]), caches, [1])
                    assert torch.allclose(f, feats[s - 1][off + j:off + j + 1], atol=1e-5), (off, b, s)
                    checked += 1
    assert checked == 2 * (7 + 5)  # every chain that fits: b < n - 2, both later drafts


def test_a_head_for_another_model_is_a_start_up_error(tiny_head, tmp_path):
    other = make_tiny_model(tmp_path / "other", "llama", seed=5)
    with pytest.raises(InvalidRequestError, match="trained for another model.*embedding_sha256"):
        LLM(str(other), speculative_method="eagle", draft_model=str(tiny_head), **BASE)
    with pytest.raises(InvalidRequestError, match="not an EAGLE head folder"):
        LLM(str(other), speculative_method="eagle", draft_model=str(tmp_path), **BASE)
    with pytest.raises(InvalidRequestError, match="'eagle' needs draft_model"):
        LLM(str(other), speculative_method="eagle", **BASE)


def test_pending_rows_keep_the_newest():
    """Rows wait for the head's next draft up to MAX_PENDING per request; beyond, the oldest go (a cut
    through an entry keeps its tail, positions and next tokens aligned)."""
    from ridgeline.speculative.eagle import MAX_PENDING, _State

    def rows(a, b):
        return torch.arange(a, b, dtype=torch.float32)[:, None], list(range(a, b + 1))

    st = _State((torch.empty(0), torch.empty(0)))
    st.add(0, *rows(0, MAX_PENDING - 10))
    assert st.num_pending == MAX_PENDING - 10 and len(st.pending) == 1
    st.add(MAX_PENDING - 10, *rows(MAX_PENDING - 10, MAX_PENDING + 20))
    assert st.num_pending == MAX_PENDING
    start, h, row, ids = st.pending[0]  # rows [row, row + len(ids) - 1) of h
    assert (start, int(h[row, 0]), ids[0], len(ids)) == (20, 20, 20, MAX_PENDING - 29)
    st.add(MAX_PENDING + 20, *rows(MAX_PENDING + 20, 2 * MAX_PENDING + 40))  # more than fits on its own
    assert st.num_pending == MAX_PENDING and len(st.pending) == 1
    start, h, row, ids = st.pending[0]
    assert (start, int(h[row, 0]), ids[-1]) == (MAX_PENDING + 40, MAX_PENDING + 40, 2 * MAX_PENDING + 40)
    st.clear()
    assert st.num_pending == 0 and not st.pending


def test_a_chain_stops_at_an_unsure_draft(tiny_llama, tiny_head, monkeypatch):
    """Drafts below the confidence bars end the chain: with the bars above any probability nothing
    is proposed, with them at 0 every chain runs k deep; output is the plain engine's either way."""
    import ridgeline.speculative.eagle as eagle
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(str(tiny_llama), **BASE).generate(["The quick brown fox"], params, use_tqdm=False)[0]
    runs = {}
    for bar in (1.5, 0.0):
        monkeypatch.setattr(eagle, "MIN_CONFIDENCE", bar)
        monkeypatch.setattr(eagle, "MIN_PATH_CONFIDENCE", bar)
        llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
                  speculative_controller="off", **BASE)
        out = llm.generate(["The quick brown fox"], params, use_tqdm=False)[0]
        assert out.outputs[0].token_ids == plain.outputs[0].token_ids
        runs[bar] = llm.engine.spec_stats
    assert runs[1.5].proposed == 0
    assert runs[0.0].proposed > 0 and len(runs[0.0].proposed_at) == 3  # chains 3 deep


def test_drafting_on_the_engines_kernels_is_the_torch_path():
    """With use_kernels (matmuls handed to other kernels; norms, SiLU*up and the rotary table then
    the engine's C ops), drafting steps agree with plain torch."""
    import copy
    from ridgeline.kernels import cpu_ops
    if not cpu_ops.available():
        pytest.skip("no C kernels on this machine")
    torch.manual_seed(2)
    head = EagleHead(HeadConfig(32, 4, 2, 8, 64, 1e-5, 10000.0)).eval()
    fused = copy.deepcopy(head)
    fused.use_kernels(lambda w: (lambda x, w=w.float(): x @ w.T))
    h, e = torch.randn(30, 32), torch.randn(30, 32)
    with torch.no_grad():
        outs = []
        for m in (head, fused):
            caches, rows = [m.empty_cache()], []
            for a, b in ((0, 20), (20, 23), (23, 24), (24, 30)):
                f, caches = m.step(h[a:b], e[a:b], torch.arange(a, b), caches, [b - a])
                rows.append(f)
            outs.append(torch.cat(rows))
    assert fused._table is not None and fused._table[0].shape[0] >= 30
    assert torch.allclose(outs[0], outs[1], atol=1e-4)


def test_backlog_counts_the_rows_the_head_has_not_read(tiny_llama, tiny_head):
    """What the controller prices a restart with: after a prompt's prefill the head owes its rows;
    a catch-up pays them (the rows past a verification's worth measured as setup)."""
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=2,
              speculative_controller="on", enable_prefix_caching=False, **BASE)
    eng, prop = llm.engine, llm.engine.proposer
    eng.add_request("b", list(range(5, 25)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    eng.spec.controller.choose = lambda ids, *a: [0] * len(ids)  # the controller drafts nothing yet
    eng.step(emit_unfinished=False)  # prefill, then one step without drafts
    eng.step(emit_unfinished=False)
    n = eng.requests["b"].num_tokens
    assert prop.backlog("b", n) == n - 1  # every position but the last, whose successor is unknown
    eng.spec.configure(2, controller=False)
    eng.step(emit_unfinished=False)
    assert prop.setup_rows == n - 1 - 3 and prop.setup_time > 0
    assert prop.backlog("b", eng.requests["b"].num_tokens) <= 3  # only the verified rows of that step


def test_speculation_pinned_off_runs_as_a_plain_engine(tiny_llama, tiny_head):
    """k = 0 with the controller off (a benchmark's "off"): the head is not fed at all; drafting
    turned on again later starts from the rows after the gap, and greedy output stays exact."""
    plain = LLM(str(tiny_llama), enable_prefix_caching=False, **BASE)
    want = plain.generate([list(range(5, 25))], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=2,
              speculative_controller="off", enable_prefix_caching=False, **BASE)
    eng, prop = llm.engine, llm.engine.proposer
    eng.spec.configure(0, controller=False)
    eng.add_request("c", list(range(5, 25)), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for _ in range(4):
        eng.step(emit_unfinished=False)
    assert prop.backlog("c", eng.requests["c"].num_tokens) == 0 and "c" not in prop.states
    eng.spec.configure(2, controller=False)
    done = []
    while eng.has_unfinished():
        done += eng.step(emit_unfinished=False)
    assert done[0].outputs[0].token_ids == want[0].outputs[0].token_ids and eng.spec.stats.proposed > 0
