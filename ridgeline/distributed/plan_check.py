"""What a follower checks in each call rank 0 publishes before any of it reaches a tensor or a C kernel:
the method is one it runs, the arguments have the types the runner takes, and every index in them
(token ids, block ids, KV slots, positions, tier slots, draft tensors) is inside what this rank holds.
The channel is authenticated (plan_channel.py); this is the second wall, so a bug or a mismatched
peer fails a step with a named error instead of writing outside the KV pool."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ridgeline.step_plan import TierCopies
from ridgeline.errors import RidgelineError
from ridgeline.sampling_params import SamplingParams
from ridgeline.runner.draft import Draft
from ridgeline.step_plan import PromptLogprobs, SampledSeq, ScheduledSeq, StepPlan

# runner methods that run the model (or gather / reset a pipeline's counters), and the group's own calls
RUNNER_CALLS = ("execute", "prefill_only", "all_logits", "all_hidden", "pipeline_stats", "reset_pipeline_stats")
GROUP_CALLS = ("stop", "probe", "probe_p2p")
MAX_ID = 1 << 12  # a request id's length


class PlanError(RidgelineError):
    """A call from rank 0 that this rank will not run."""


@dataclass(frozen=True)
class Limits:
    vocab: int  # token ids in [0, vocab)
    num_blocks: int  # block ids in [0, num_blocks)
    block_size: int
    max_len: int  # positions in [0, max_len)
    tier_slots: int = 0  # second KV tier slots in [0, tier_slots)


def check_call(method, args, lim: Limits) -> None:
    if not isinstance(method, str) or method not in RUNNER_CALLS + GROUP_CALLS:
        raise PlanError(f"unknown call {method!r} from rank 0 (mismatched versions across ranks?)")
    if not isinstance(args, tuple):
        raise PlanError(f"{method}: arguments are not a tuple")
    if method == "execute":
        _arity(method, args, 2)
        plan, drafts = args
        _check_plan(plan, lim)
        if drafts is not None:
            _check_drafts(drafts, lim)
    elif method in ("all_logits", "all_hidden"):
        _arity(method, args, 1)
        _check_seq(args[0], lim)
    elif method == "prefill_only":
        _arity(method, args, 3)
        rid, ids, table = args
        _req_id(rid)
        _ids(ids, lim.vocab, "prompt")
        _blocks(table, len(ids), lim)
    elif method in ("probe", "probe_p2p"):
        _arity(method, args, 2)
        sizes, reps = args
        if not (isinstance(sizes, tuple) and all(_int(s, 1, 1 << 26) for s in sizes) and _int(reps, 1, 10_000)):
            raise PlanError(f"{method}: sizes and repetitions out of range")
    else:
        _arity(method, args, 0)


def _arity(method: str, args: tuple, n: int) -> None:
    if len(args) != n:
        raise PlanError(f"{method} takes {n} arguments, got {len(args)}")


def _int(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi


def _req_id(rid) -> None:
    if not isinstance(rid, str) or len(rid) > MAX_ID:
        raise PlanError("a request id that is not a short string")


def _ids(ids, vocab: int, what: str) -> None:
    if not isinstance(ids, list) or not all(_int(t, 0, vocab) for t in ids):
        raise PlanError(f"{what}: token ids outside [0, {vocab})")


def _blocks(table, num_slots: int, lim: Limits) -> None:
    """table covers num_slots KV slots with block ids this rank holds."""
    if not isinstance(table, list) or not all(_int(b, 0, lim.num_blocks) for b in table):
        raise PlanError(f"block ids outside [0, {lim.num_blocks})")
    if len(table) * lim.block_size < num_slots:
        raise PlanError(f"a block table of {len(table)} blocks for {num_slots} KV slots")


def _check_plan(plan, lim: Limits) -> None:
    if not isinstance(plan, StepPlan) or not isinstance(plan.seqs, list):
        raise PlanError("execute: not a step plan")
    if not isinstance(plan.finished_ids, list):
        raise PlanError("execute: finished ids are not a list")
    for rid in plan.finished_ids:
        _req_id(rid)
    copies = plan.kv_copies
    if copies is not None:
        if not isinstance(copies, TierCopies):
            raise PlanError("execute: tier copies of the wrong type")
        for pairs in (copies.stores, copies.loads):
            if not isinstance(pairs, list):
                raise PlanError("execute: tier copies are not a list")
            for p in pairs:
                if not (isinstance(p, tuple) and len(p) == 2):
                    raise PlanError("execute: a tier copy that is not a (block, slot) pair")
        if not all(_int(b, 0, lim.num_blocks) and _int(s, 0, lim.tier_slots) for b, s in copies.stores) or \
                not all(_int(s, 0, lim.tier_slots) and _int(b, 0, lim.num_blocks) for s, b in copies.loads):
            raise PlanError("execute: tier copies outside the pool or the tier")
    for s in plan.seqs:
        _check_seq(s, lim)


def _check_seq(s, lim: Limits) -> None:
    if not isinstance(s, ScheduledSeq):
        raise PlanError("not a scheduled sequence")
    _req_id(s.req_id)
    _ids(s.token_ids, lim.vocab, s.req_id)
    n = len(s.token_ids)
    if n == 0 or not _int(s.start, 0, lim.max_len) or s.start + n > lim.max_len:
        raise PlanError(f"{s.req_id}: positions {s.start}..{s.start + n} outside [0, {lim.max_len})")
    slot = s.start if s.cache_start is None else s.cache_start
    if not _int(slot, 0, lim.max_len):
        raise PlanError(f"{s.req_id}: a KV slot start outside [0, {lim.max_len})")
    _blocks(s.block_table, slot + n, lim)
    if not (_int(s.num_spec, 0, n) and _int(s.num_prompt_tokens, 0, lim.max_len + 1)):
        raise PlanError(f"{s.req_id}: proposal or prompt counts out of range")
    if not isinstance(s.sample, bool) or not isinstance(s.score_prompt, bool):
        raise PlanError(f"{s.req_id}: flags that are not booleans")
    if s.params is not None and not isinstance(s.params, SamplingParams):
        raise PlanError(f"{s.req_id}: sampling parameters of the wrong type")
    if s.params is not None and s.params.logit_bias and s.params.logit_bias[-1][0] >= lim.vocab:
        raise PlanError(f"{s.req_id}: a logit bias outside the vocabulary")
    if s.seed is not None and not _int(s.seed, -(1 << 63), 1 << 63):
        raise PlanError(f"{s.req_id}: a seed outside 64 bits")
    if s.history is not None:
        _ids(s.history, lim.vocab, s.req_id)
    if s.next_token is not None and not _int(s.next_token, 0, lim.vocab):
        raise PlanError(f"{s.req_id}: a next prompt token outside the vocabulary")
    slots = lim.num_blocks * lim.block_size
    if not isinstance(s.kv_moves, list) or not all(
            isinstance(m, tuple) and len(m) == 2 and _int(m[0], 0, slots) and _int(m[1], 0, slots)
            for m in s.kv_moves):
        raise PlanError(f"{s.req_id}: KV moves outside the pool")


def _check_drafts(drafts, lim: Limits) -> None:
    if not isinstance(drafts, dict):
        raise PlanError("execute: drafts are not a dict")
    for rid, d in drafts.items():
        _req_id(rid)
        if not isinstance(d, Draft):
            raise PlanError(f"{rid}: a draft of the wrong type")
        _ids(d.token_ids, lim.vocab, rid)
        if d.probs is None:
            continue
        p = d.probs
        if not (isinstance(p, torch.Tensor) and p.dtype == torch.float32 and p.dim() == 2
                and p.shape[0] >= len(d.token_ids)):
            raise PlanError(f"{rid}: draft probabilities of the wrong shape or dtype")
        if d.ids is None:
            if p.shape[1] != lim.vocab:
                raise PlanError(f"{rid}: draft probabilities over {p.shape[1]} tokens, not the vocabulary")
        elif not (isinstance(d.ids, torch.Tensor) and d.ids.dtype == torch.int64 and d.ids.shape == p.shape
                  and (d.ids.numel() == 0 or (int(d.ids.min()) >= 0 and int(d.ids.max()) < lim.vocab))):
            raise PlanError(f"{rid}: draft token ids of the wrong shape or outside the vocabulary")


def check_answer(answer, vocab: int) -> None:
    """The last pipeline stage's (sampled, scored) for stage 0: its tokens feed the next step."""
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], list)
            and isinstance(answer[1], dict)):
        raise PlanError("the last stage's answer is not (sampled, prompt logprobs)")
    for s in answer[0]:
        if not isinstance(s, SampledSeq):
            raise PlanError("the last stage's answer holds something other than sampled sequences")
        _req_id(s.req_id)
        _ids(s.token_ids, vocab, s.req_id)
    for rid, lp in answer[1].items():
        _req_id(rid)
        if not isinstance(lp, PromptLogprobs):
            raise PlanError("the last stage's prompt logprobs are of the wrong type")
        _ids(lp.token_ids, vocab, rid)
