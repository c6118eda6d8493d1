"""The EAGLE head's layer on the C decoder stack (spec/eagle_stack.py): drafting steps give the torch
path's features (q/k rows permuted for the stack's interleaved rotary); a chain's advanced caches
leave the request's own untouched; the pool grows past its first size and takes blocks back."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from ridgeline.layers.kernel_plan import choose_kernels
from ridgeline.layers.linear import matmul_fn
from ridgeline.speculative.eagle_head import EagleHead, HeadConfig
from ridgeline.speculative.eagle_stack import BLOCK, HeadCache, interleave_rows


def _heads(seed: int = 0, pointer_dim: int = 0):
    plan = choose_kernels(torch.device("cpu"), torch.float32, torch.float32)
    if not plan.c_stack or torch.float32 not in plan.packed:
        pytest.skip("no C decoder stack with packed fp32 matmuls on this machine")
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig(32, 4, 2, 8, 64, 1e-5, 10000.0, pointer_dim)).eval()
    fused = copy.deepcopy(head)
    fused.use_kernels(lambda w: matmul_fn(w.float().contiguous(), plan))
    assert fused.stack is not None
    return head, fused


def test_interleaved_rows_rotate_as_the_halves_layout():
    """Rotating the permuted projection pairwise (interleaved) is the halves rotation, permuted: the
    same permutation of q and k, so every dot product is unchanged."""
    torch.manual_seed(3)
    d, heads = 8, 2
    w, x = torch.randn(heads * d, 5), torch.randn(5)
    ang = torch.randn(d // 2)
    cos, sin = ang.cos(), ang.sin()
    halves = (w @ x).view(heads, d)
    a, b = halves[:, :d // 2], halves[:, d // 2:]
    rot_halves = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    pairs = (interleave_rows(w, heads, d) @ x).view(heads, d // 2, 2)
    rot_pairs = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin,
                             pairs[..., 1] * cos + pairs[..., 0] * sin], -1).view(heads, d)
    order = torch.arange(d).view(2, d // 2).T.reshape(-1)
    assert torch.allclose(rot_pairs, rot_halves[:, order], atol=1e-6)


def test_stack_steps_are_the_torch_path():
    """Several requests per call, uneven chunks, gaps in positions: the stack's features agree with
    the torch path's; an advanced cache shares the request's blocks and leaves its length alone."""
    head, fused = _heads()
    torch.manual_seed(4)
    outs = []
    for m in (head, fused):
        torch.manual_seed(5)
        caches, rows, lens = [m.empty_cache(), m.empty_cache()], [], [0, 0]
        with torch.no_grad():
            for counts in ([20, 3], [1, 1], [BLOCK + 3, 2], [1, 0], [0, 5]):
                T = sum(counts)
                h, e = torch.randn(T, 32), torch.randn(T, 32)
                pos = []
                for i, n in enumerate(counts):  # a gap of 2 positions before each chunk
                    pos += range(lens[i] + 2, lens[i] + 2 + n)
                    lens[i] += 2 + n
                f, new = m.step(h, e, torch.tensor(pos), caches, counts)
                rows.append(f)
                caches = new
        outs.append(torch.cat(rows))
    assert torch.allclose(outs[0], outs[1], atol=1e-4)
    assert all(isinstance(c, HeadCache) for c in caches)  # the last run's: the stack's
    with torch.no_grad():
        mine = fused.empty_cache()
        _, (mine,) = fused.step(torch.randn(3, 32), torch.randn(3, 32), torch.arange(3), [mine], [3])
        _, (ahead,) = fused.step(torch.randn(1, 32), torch.randn(1, 32), torch.tensor([3]), [mine], [1])
    assert (mine.length, ahead.length) == (3, 4) and ahead.blocks is mine.blocks


def test_the_pointers_projections_come_with_the_step():
    """step_pointer on the stack (one C call: the step, then the pointer's query and key of each row's
    u) gives the torch path's features, queries and keys."""
    head, fused = _heads(2, pointer_dim=8)
    torch.manual_seed(6)
    h, e, own = torch.randn(9, 32), torch.randn(9, 32), torch.randn(9, 32)
    outs = []
    with torch.no_grad():
        for m in (head, fused):
            caches = [m.empty_cache(), m.empty_cache()]
            got = m.step_pointer(h[:7], e[:7], own[:7], torch.tensor([0, 1, 2, 3, 4, 0, 1]), caches, [5, 2])
            more = m.step_pointer(h[7:], e[7:], own[7:], torch.tensor([5, 2]), got[1], [1, 1])
            outs.append([torch.cat([a, b]) for a, b in zip((got[0], got[2], got[3]), (more[0], more[2], more[3]))])
    for want, have in zip(*outs):
        assert have.shape == want.shape and torch.allclose(have, want, atol=1e-4)


def test_the_pool_grows_and_takes_blocks_back():
    head, fused = _heads(1)
    stack = fused.stack
    first = stack.k.shape[0]
    n = first * BLOCK + 5  # more positions than the first pool holds
    h, e = torch.randn(n, 32), torch.randn(n, 32)
    with torch.no_grad():
        want = head(h, e, torch.arange(n))
        _, (cache,) = fused.step(h[:-1], e[:-1], torch.arange(n - 1), [fused.empty_cache()], [n - 1])
        got, (cache,) = fused.step(h[-1:], e[-1:], torch.tensor([n - 1]), [cache], [1])
    assert stack.k.shape[0] > first
    assert torch.allclose(got, want[-1:], atol=1e-4)  # the rows written before the pool grew survive it
    free = len(stack.free)
    fused.release(cache)
    assert len(stack.free) == free + -(-n // BLOCK) and cache.blocks == [] and cache.length == 0


@pytest.mark.parametrize("match", [0, 3], ids=["no-match", "match"])
@pytest.mark.parametrize("gate_bias", [-30.0, 0.0, 3.0])
def test_the_c_draft_pick_is_the_torch_pick(gate_bias, match):
    """kernels/eagle_draft.c's draft decision against the torch reference (softmax top over the draft
    vocabulary, CopyPointer.attend, pick) on random rows: same tokens, same probabilities; a closed
    gate leaves the head's choice, an open one copies; a pointer reading exact matches gets the same
    match lengths (from each row's tokens and its keys' positions) and biases in C."""
    from ridgeline.kernels import cpu_draft
    from ridgeline.speculative.eagle_pointer import CopyPointer, draft_vocab_index, match_lengths, pick
    plan = choose_kernels(torch.device("cpu"), torch.float32, torch.float32)
    if not plan.c_stack or torch.float32 not in plan.packed:
        pytest.skip("no C decoder stack with packed fp32 matmuls on this machine")
    torch.manual_seed(7)
    H, d, vocab, n = 16, 8, 50, 5
    vocab_ids = torch.randperm(vocab)[:20].sort().values
    index = draft_vocab_index(vocab_ids, vocab)
    rows = torch.randn(len(vocab_ids), H)
    lin = matmul_fn(rows.contiguous(), plan)
    fmt, data, scale = lin.format.stack_weight(lin)
    ptr = CopyPointer(H, d, match).eval()
    with torch.no_grad():
        ptr.gate.bias.fill_(gate_bias)
        if match:
            ptr.match_bias.copy_(torch.randn(match + 1) * 3)
    feats, q = torch.randn(n, H), torch.randn(n, d) * 3
    keys = [torch.randn(m, d) for m in (0, 1, 4, 9, 9)]
    payload = [torch.randint(0, vocab, (k.shape[0],)) for k in keys]
    payload[4][:] = payload[4][0]  # one token at every position: masses add up
    m = np.array([k.shape[0] for k in keys], dtype=np.int64)
    ptrs_k = np.array([k.data_ptr() for k in keys], dtype=np.int64)
    ptrs_p = np.array([p.data_ptr() for p in payload], dtype=np.int64)
    tokens, probs, mass = torch.empty(n, dtype=torch.int64), torch.empty(n), torch.zeros(vocab)
    rows_at = np.array([feats.data_ptr() + 4 * H * i for i in range(n)], dtype=np.int64)  # by address
    q_at = np.array([q.data_ptr() + 4 * d * i for i in range(n)], dtype=np.int64)
    # each row's tokens (3 symbols: matches of every length) and its keys' positions, increasing with gaps
    ctx = [np.random.default_rng(i).integers(0, 3, 40).astype(np.int64) for i in range(n)]
    kpos = [np.sort(np.random.default_rng(10 + i).choice(30, k.shape[0], replace=False)).astype(np.int64)
            for i, k in enumerate(keys)]
    ends = np.array([31 + i for i in range(n)], dtype=np.int64)
    extra = {}
    if match:
        extra = dict(match=np.array([[cpu_draft.addr(c) for c in ctx], [cpu_draft.addr(k) for k in kpos], ends]),
                     match_bias=ptr.match_bias.detach().contiguous())
    cpu_draft.draft_pick(torch.tensor([fmt, data, scale, 0]), rows_at, torch.empty(n, H), torch.empty(n, len(vocab_ids)),
                         vocab_ids, index, q_at, ptrs_k, ptrs_p, m, float(ptr.scale),
                         ptr.gate.weight.detach()[0].contiguous(), float(ptr.gate.bias), mass, torch.empty(16 + d),
                         tokens, probs, **extra)
    assert not mass.any()
    head = torch.softmax(feats @ rows.T, -1)
    copied = 0
    with torch.no_grad():
        for i in range(n):
            top = (int(vocab_ids[head[i].argmax()]), float(head[i].max()))
            want = top
            if m[i]:
                lengths = torch.from_numpy(match_lengths(ctx[i], kpos[i] + 1, int(ends[i]), match))[None] \
                    if match else None
                a, g = ptr.attend(q[i:i + 1], keys[i], None, feats[i:i + 1], head[i].max()[None], lengths)
                want = pick(a[0], float(g[0]), payload[i], head[i], index, top, torch.zeros(vocab))
            copied += want[0] != top[0]
            assert int(tokens[i]) == want[0]
            assert float(probs[i]) == pytest.approx(want[1], rel=1e-4, abs=1e-6)
    if gate_bias < -10:
        assert copied == 0
    if gate_bias > 0:
        assert copied > 0


def _without_pointer(head_dir, out):
    """A copy of a head folder with its copy pointer taken out (an older head's shape)."""
    import json
    from safetensors.torch import load_file, save_file
    out.mkdir()
    save_file({k: v for k, v in load_file(str(head_dir / "head.safetensors")).items() if not k.startswith("pointer.")},
              str(out / "head.safetensors"))
    config = json.loads((head_dir / "config.json").read_text())
    config["head"]["pointer_dim"] = 0
    (out / "config.json").write_text(json.dumps(config))
    return out


def _without_match(head_dir, out):
    """A copy of a head folder whose copy pointer reads no exact matches (an older pointer's shape): its
    match bias and the gate's input for the longest match taken out."""
    import json
    from safetensors.torch import load_file, save_file
    out.mkdir()
    tensors = load_file(str(head_dir / "head.safetensors"))
    del tensors["pointer.match_bias"]
    tensors["pointer.gate.weight"] = tensors["pointer.gate.weight"][:, :-1].contiguous()
    save_file(tensors, str(out / "head.safetensors"))
    config = json.loads((head_dir / "config.json").read_text())
    config["head"].pop("pointer_match")
    (out / "config.json").write_text(json.dumps(config))
    return out


def _head(pointer: str, tiny_head, tmp_path):
    """The tiny head with a copy pointer reading exact matches, one reading none, or none."""
    return {"match": lambda: tiny_head, "no-match": lambda: _without_match(tiny_head, tmp_path / "head"),
            "none": lambda: _without_pointer(tiny_head, tmp_path / "head")}[pointer]()


def _drafts_two_ways(tiny_llama, head, setup) -> list[list]:
    """The test prompts through the EAGLE proposer (k = 3, pinned) twice, setup(proposer, True) then
    setup(proposer, False) applied to a fresh engine each time: each run's output must be the plain
    engine's; returns each run's proposals, step by step."""
    from ridgeline import LLM
    from test_eagle import BASE
    from test_multi_token_steps import _params, _run
    params = _params()
    plain = _run(LLM(str(tiny_llama), **BASE), params)
    drafts = []
    for first in (True, False):
        llm = LLM(str(tiny_llama), speculative_method="eagle", draft_model=str(head), num_speculative_tokens=3,
                  speculative_controller="off", **BASE)
        prop = llm.engine.proposer
        if prop._c is None:
            pytest.skip("the head's C paths do not run on this machine")
        setup(prop, first)
        seen = []
        real = prop.propose
        prop.propose = lambda reqs, real=real, seen=seen: seen.append(out := real(reqs)) or out
        assert _run(llm, params) == plain
        drafts.append(seen)
    return drafts


@pytest.mark.parametrize("pointer", ["match", "no-match", "none"], ids=["pointer", "pointer-no-match", "no-pointer"])
def test_the_c_and_torch_drafting_paths_draft_alike(tiny_llama, tiny_head, monkeypatch, tmp_path, pointer):
    """The proposer on its C paths (head step with its own paged K/V, embeddings looked up in C, the C
    draft pick; catch-ups split into calls of a few rows; hidden states kept whole or copied per
    request) and forced onto torch's (where those kernels
    do not run) drafts the same tokens, and both keep the plain engine's greedy output; with a copy
    pointer reading exact matches (the default), one reading none (an older head's), and none."""
    from ridgeline.speculative import eagle, eagle_fast
    monkeypatch.setattr(eagle_fast, "CHUNK_ROWS", 5)
    monkeypatch.setattr(eagle, "WHOLE_ROWS", 2)  # steps of more rows: hidden states copied per request

    def torch_path(prop, c_path):
        assert (prop.pointer is not None) == (pointer != "none")
        assert pointer == "none" or bool(prop.pointer.match) == (pointer == "match")
        if not c_path:  # the torch path throughout: the head's layer too
            prop._c, prop.head.stack = None, None

    drafts = _drafts_two_ways(tiny_llama, _head(pointer, tiny_head, tmp_path), torch_path)
    # the paths round differently (fp32 attention order, the pick's softmax): a near tie may draft
    # another token, so the check is agreement, not identity (identical on the machines seen)
    pairs = [(a, b) for sa, sb in zip(*drafts) for da, db in zip(sa, sb) for a, b in zip(da, db)]
    assert len(pairs) > 20 and sum(a == b for a, b in pairs) >= 0.95 * len(pairs)


@pytest.mark.parametrize("bars", ["default", "off"])
@pytest.mark.parametrize("pointer", ["match", "no-match", "none"], ids=["pointer", "pointer-no-match", "no-pointer"])
def test_the_fused_c_chain_drafts_what_the_per_call_c_path_does(tiny_llama, tiny_head, tmp_path, monkeypatch,
                                                                pointer, bars):
    """Greedy chains in one C call (ridgeline_eagle_chain) and the same chains as a C call per pick and
    per head step, driven from Python, draft exactly the same tokens, step by step, requests batched,
    k = 3 (so chains step the head twice), and keep the plain engine's output; with the confidence
    bars as shipped, and off (the random head is seldom sure: every chain then goes the whole way)."""
    from ridgeline.speculative import eagle
    if bars == "off":
        monkeypatch.setattr(eagle, "MIN_CONFIDENCE", 0.0)
        monkeypatch.setattr(eagle, "MIN_PATH_CONFIDENCE", 0.0)
    calls = []

    def fused_or_not(prop, fused):
        prop.fused_chain = fused
        real = prop._c.chain
        prop._c.chain = lambda *a: calls.append(fused) or real(*a)

    drafts = _drafts_two_ways(tiny_llama, _head(pointer, tiny_head, tmp_path), fused_or_not)
    assert calls and all(calls)  # the fused path called it, the per-call one never
    assert drafts[0] == drafts[1]
    chains = [len(d) for step in drafts[0] for d in step]
    if bars == "off":  # chains that stepped the head twice
        assert sum(n == 3 for n in chains) >= 20
    elif pointer != "none":  # the pointer's copies are sure enough to chain
        assert sum(n > 1 for n in chains) >= 2


def test_the_head_packs_in_the_fewest_bytes_a_kernel_here_multiplies():
    """The head's weights go to group-wise int4 in the largest group dividing every input width (its
    fc reads 2H, the copy pointer's projection 4H), else per-channel int8, else the target's dtype."""
    from ridgeline.speculative.eagle import head_format

    default = HeadConfig(576, 9, 3, 64, 1536, 1e-5, 1e5, 128, 8)  # the shipped head's shape
    assert head_format(frozenset({"int4", "int8"}), default) == "int4-g64"  # 576 = 9 * 64, not 128
    assert head_format(frozenset({"int8"}), default) == "int8"
    assert head_format(frozenset(), default) is None
    assert head_format(frozenset({"int4", "int8"}), HeadConfig(4096, 32, 8, 128, 11008, 1e-5, 1e4)) == "int4-g128"
    assert head_format(frozenset({"int4", "int8"}), HeadConfig(48, 4, 2, 12, 100, 1e-5, 1e4)) == "int8"  # 100 % 32
