"""The EAGLE head's copy pointer (spec/eagle_pointer.py): the mixture's pick by hand-built numbers,
a hand-set pointer copies what followed the matching position, training learns to copy on a
synthetic task (and, reading exact matches, to trust longer ones), match lengths by hand and the
drafting and training computations of them agree, the proposer keeps exactly the keys and tokens of
the positions the head was fed, and `train-draft --from-head` adds a pointer to a trained head
without touching it."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.speculative.eagle_head import EagleHead, HeadConfig
from ridgeline.speculative.eagle_pointer import (CopyPointer, draft_vocab_index, match_lengths, match_matrix, pick,
                                         train_pointer)
from ridgeline.speculative.train_data import Sample

BASE = dict(dtype="float32", kv_cache_memory="2MiB", progress=False)


def test_pick_takes_the_mixtures_most_likely_token():
    head_probs = torch.tensor([0.5, 0.3, 0.2])  # draft vocabulary: tokens 10, 11, 12
    index = draft_vocab_index(torch.tensor([10, 11, 12]), 20)
    assert index[10] == 0 and index[12] == 2 and (index[:10] == -1).all()
    scratch = torch.zeros(20)
    a = torch.tensor([0.25, 0.75])

    def mix(a, g, payload, probs=head_probs, vocab_index=index, top=(10, 0.5)):
        out = pick(a, g, torch.tensor(payload, dtype=torch.long), probs, vocab_index, top, scratch)
        assert not scratch.any()  # left zero for the next call
        return out
    # copy mass: token 11 0.75 (+ its own 0.3), token 15 (not in the draft vocabulary) 0.25
    t, p = mix(a, 0.5, [15, 11])
    assert t == 11 and p == pytest.approx(0.5 * 0.75 + 0.5 * 0.3)
    t, p = mix(a, 0.1, [15, 11])  # a nearly closed gate: the head's own top token
    assert t == 10 and p == pytest.approx(0.9 * 0.5)
    t, p = mix(torch.tensor([1.0, 0.0]), 0.9, [15, 11])  # a token outside the draft vocabulary
    assert t == 15 and p == pytest.approx(0.9)
    t, p = mix(torch.tensor([0.0, 1.0]), 0.9, [15, 10])  # the copy agrees with the head
    assert t == 10 and p == pytest.approx(0.9 + 0.1 * 0.5)
    t, p = mix(torch.tensor([0.5, 0.5]), 0.9, [12, 12])  # mass of repeated positions adds up
    assert t == 12 and p == pytest.approx(0.9 + 0.1 * 0.2)
    t, p = mix(torch.tensor([]), 0.0, [], probs=torch.tensor([0.2, 0.5, 0.3]), vocab_index=None, top=(1, 0.5))
    assert t == 1 and p == pytest.approx(0.5)


def _copy_by_token_pointer(H: int, vocab: int) -> CopyPointer:
    """A pointer whose query and key read only the embedding part of u (x_{j+1}), with a gate open
    wide: it copies the token that followed the earlier occurrence of the current token."""
    ptr = CopyPointer(H, H)
    with torch.no_grad():
        for lin in (ptr.q, ptr.k):
            lin.weight.zero_()
            lin.bias.zero_()
            lin.weight[:, :H] = torch.eye(H)
        ptr.gate.weight.zero_()
        ptr.gate.bias.fill_(20.0)
        ptr.scale.fill_(10.0)
    return ptr


def test_a_hand_set_pointer_copies_what_followed():
    H, vocab = 16, 16
    emb = torch.eye(vocab)[:, :H]
    x = [9, 5, 6, 7, 8, 5]  # head position j reads x_{j+1}: 5 6 7 8 5; the last 5 first came at j = 0
    ptr = _copy_by_token_pointer(H, vocab)
    e = emb[torch.tensor(x[1:])]
    u = CopyPointer.describe(e, emb[torch.tensor(x[:-1])], torch.zeros(5, H), torch.zeros(5, H))
    with torch.no_grad():
        a, g = ptr.attend(ptr.q(u[-1:]), ptr.k(u[:-1]), None, torch.zeros(1, H), torch.tensor([0.9]))
    payload = torch.tensor(x[2:])  # x_{j+2} for j = 0 .. 3
    t, p = pick(a[0], float(g[0]), payload, torch.full((vocab,), 1.0 / vocab), None, (0, 1.0 / vocab),
                torch.zeros(vocab))
    assert t == 6 and p > 0.99


def _repeats(V: int, half: int, H: int = 24, seed: int = 0):
    """(table, head, sample): sequences that repeat their first half; the target's hidden state at j
    names token j+1 (it predicts perfectly: its argmax label), the head random and frozen."""
    table = torch.randn(V, H)
    head = EagleHead(HeadConfig(H, 4, 2, 6, 32, 1e-5, 10000.0)).eval()
    rng = random.Random(seed)

    def sample():
        first = [rng.randrange(V) for _ in range(half)]
        tokens = torch.tensor(first + first)
        return Sample(tokens, torch.cat([table[tokens[1:]], table[:1]]))
    return table, head, sample


def _copy_accuracy(pointer, head, table, sample, start: int) -> float:
    """How often the mixture's pick is the next token, at positions start.. of 8 fresh samples
    (position t drafts x_{t+2}); with exact matches read as training reads them."""
    right = total = 0
    V = table.shape[0]
    with torch.no_grad():
        for _ in range(8):
            s = sample()
            n = len(s.tokens)
            e = table[s.tokens[1:]]
            f = head(s.hidden[:-1], e, torch.arange(n - 1))
            u = CopyPointer.describe(e, table[s.tokens[:-1]], s.hidden[:-1], f)
            probs = torch.softmax(f @ table.T, -1)
            L = match_matrix(s.tokens, pointer.match) if pointer.match else None
            for t in range(start, n - 2):
                a, g = pointer.attend(pointer.q(u[t:t + 1]), pointer.k(u[:t]), None, f[t:t + 1],
                                      probs[t:t + 1].max(-1).values, None if L is None else L[t:t + 1, :t])
                top = probs[t].max(-1)
                tok, _ = pick(a[0], float(g[0]), s.tokens[2:t + 2], probs[t], None, (int(top.indices), float(top.values)),
                              torch.zeros(V))
                right += tok == int(s.tokens[t + 2])
                total += 1
    return right / total


def test_training_learns_to_copy():
    """Sequences that repeat their first half: the head (random, frozen) cannot know the second
    half, the pointer learns to copy it from the first."""
    torch.manual_seed(0)
    V, half = 48, 12
    table, head, sample = _repeats(V, half)
    label = lambda h: (h @ table.T).argmax(-1)  # noqa: E731
    pointer = CopyPointer(24, 16)
    stats = train_pointer(pointer, head, lambda ids: table[ids], table, None, label, V,
                          [sample() for _ in range(64)], epochs=30, seed=0, lr=5e-3, batch_tokens=256, progress=False)
    assert stats["steps"] > 0
    assert _copy_accuracy(pointer, head, table, sample, half) > 0.8  # inside the repeat


def test_the_proposer_keeps_the_fed_positions_keys(tiny_llama, tiny_head):
    """Mid-run: one key per fed position, each the pointer's key of that position's u computed from
    the target's hidden states (the training path), with the token two ahead as its payload."""
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=2,
              speculative_controller="off", enable_prefix_caching=False, **BASE)
    eng, proposer = llm.engine, llm.engine.proposer
    assert proposer.pointer is not None
    prompt = llm.tokenizer.encode("one two three four one two three four one two")
    eng.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for _ in range(6):
        eng.step()
    mem = proposer.states["r"].memory
    tokens = list(eng.requests["r"].token_ids)
    with torch.inference_mode():  # as propose() runs it
        mem.fill(tokens)
    m = mem.n
    assert mem.positions == list(range(m)) and m >= len(prompt) - 1
    assert mem.payload[:mem.known].tolist() == [tokens[j + 2] for j in range(mem.known)] and mem.known >= m - 1
    lm = eng.runner.model
    hidden = eng.prompt_hidden(tokens[:m + 1])
    with torch.no_grad():
        dev = lm.model.embed_tokens.weight.device
        e = lm.model.embed(torch.tensor(tokens[1:m + 1], device=dev)).float()
        f = proposer.head(hidden[:m].float(), e, torch.arange(m, device=dev))
        prev = lm.model.embed(torch.tensor(tokens[:m], device=dev)).float()
        ref = proposer.pointer.key(CopyPointer.describe(e, prev, hidden[:m].float(), f))  # its drafting kernels
    assert torch.allclose(mem.keys[:m], ref.to(mem.keys.device), atol=1e-3)
    while eng.has_unfinished():
        eng.step()


def test_the_pick_reads_the_requests_tokens_and_its_keys_positions(tiny_llama, tiny_head):
    """Every draft of a chain: the pointer's token buffer holds the request's tokens then the chain's
    drafts so far, its key positions are the fed positions then the chain's, and the match lengths
    they give are the training path's (match_matrix) over that same sequence."""
    llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(tiny_head), num_speculative_tokens=3,
              speculative_controller="off", **BASE)
    prop = llm.engine.proposer
    assert prop.pointer is not None and prop.pointer.match == 8  # train-draft's default
    impl = prop._c or prop
    # the chain a pick at a time (the fused C chain makes the same calls on the same buffers in C:
    # tests/test_eagle_stack.py checks it drafts the same)
    prop.fused_chain = False
    seen, checked = [], []
    real_draft, real_propose = impl.draft, prop.propose

    def draft(feats, queries, mems, step):
        mem = mems[0]
        seen.append((mem.ctx[:mem.ntok + step].copy(), mem.pos_np[:mem.known + step].copy(), list(mem.positions),
                     mem.ntok, step))
        return real_draft(feats, queries, mems, step)

    def propose(reqs):
        seen.clear()
        out = real_propose(reqs)
        toks = list(reqs[0].token_ids)
        drafts = out[0].token_ids if hasattr(out[0], "token_ids") else out[0]
        for ctx, pos, fed, N, step in seen:
            assert N == len(toks) and ctx[:N].tolist() == toks and ctx[N:].tolist() == drafts[:step]
            assert pos.tolist() == (fed + list(range(N - 1, N - 1 + step)))[:len(pos)]
            if len(pos):
                want = match_matrix(torch.tensor(ctx), 8)[N - 2 + step, pos]
                got = match_lengths(ctx, pos + 1, N - 1 + step, 8)
                assert got.tolist() == want.tolist()
                checked.append(step)
        return out

    impl.draft, prop.propose = draft, propose
    for prompt in ([5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 3, 9, 3, 9]):  # one request at a time: mems[0] is reqs[0]'s
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert 0 in checked and max(checked) >= 1


def test_match_lengths_by_hand():
    toks = np.array([5, 6, 7, 1, 5, 6, 7, 2, 6, 7], dtype=np.int64)
    # the context ends ..., 2, 6, 7 (index 9); keys whose last token is at 2 (5, 6, 7), 6 (.., 5, 6, 7),
    # 3 (.., 7, 1), 0 (5) and 8 (.., 2, 6)
    ends = np.array([2, 6, 3, 0, 8], dtype=np.int64)
    assert match_lengths(toks, ends, 9, 8).tolist() == [2, 2, 0, 0, 0]
    assert match_lengths(toks, ends, 9, 1).tolist() == [1, 1, 0, 0, 0]
    # a key's run stops at the sequence's start
    assert match_lengths(np.array([7, 6, 7], dtype=np.int64), np.array([0]), 2, 8).tolist() == [1]


def test_drafting_and_training_count_matches_alike():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        n = int(torch.randint(3, 50, (1,), generator=g))
        tokens = torch.randint(0, 3, (n,), generator=g)
        L = match_matrix(tokens, 4)
        for t in range(n - 1):  # head position t's context ends at token t + 1, key j's at j + 1
            want = match_lengths(tokens.numpy().astype(np.int64), np.arange(1, n, dtype=np.int64), t + 1, 4)
            assert L[t].tolist() == want.tolist()


def test_training_learns_to_trust_long_matches():
    """A pointer too narrow (d = 2) to find the repeat by its keys alone: reading exact matches, it
    learns a bias rising with the match length and copies the repeated half."""
    torch.manual_seed(0)
    V, half, M = 6, 12, 4
    table, head, sample = _repeats(V, half, seed=1)
    label = lambda h: (h @ table.T).argmax(-1)  # noqa: E731
    pointer = CopyPointer(24, 2, M)
    train_pointer(pointer, head, lambda ids: table[ids], table, None, label, V, [sample() for _ in range(64)],
                  epochs=20, seed=0, lr=2e-2, batch_tokens=256, progress=False)
    bias = pointer.match_bias.detach()
    assert bias[M] > bias[0] + 1.0 and bias[M] > bias[1]
    assert _copy_accuracy(pointer, head, table, sample, half + M) > 0.9  # inside the repeat, past its first M


def test_from_head_adds_a_pointer_and_keeps_the_head(tiny_llama, tiny_head, tmp_path):
    from safetensors.torch import load_file

    from ridgeline.cli import main
    base = tmp_path / "base"
    assert main(["train-draft", str(tiny_llama), "--out", str(base), "--from-head", str(tiny_head), "--tokens", "600",
                 "--seed", "1", "--max-reply-tokens", "24", "--dtype", "float32", "--copy-pointer", "8",
                 "--pointer-epochs", "1", "--quiet"]) == 0
    before, after = load_file(str(tiny_head / "head.safetensors")), load_file(str(base / "head.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("pointer."))
    assert after["pointer.q.weight"].shape[0] == 8
    config, old = json.loads((base / "config.json").read_text()), json.loads((tiny_head / "config.json").read_text())
    assert config["head"]["pointer_dim"] == 8
    assert config["head"]["pointer_match"] == 8 and after["pointer.match_bias"].shape == (9,)  # the default
    assert config["training"]["command"] == old["training"]["command"]
    assert "--from-head HEAD_DIR" in config["training"]["pointer"]["command"]
    assert main(["train-draft", str(tiny_llama), "--out", str(tmp_path / "x"), "--from-head", str(tiny_head),
                 "--copy-pointer", "0", "--quiet"]) == 2
