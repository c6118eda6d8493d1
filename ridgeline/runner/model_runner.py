"""Turns a StepPlan into tensors, runs one forward over all scheduled tokens, samples."""
from __future__ import annotations


from dataclasses import replace

import numpy as np
import torch
from torch import nn

from ridgeline.runner.prompt_logprobs import score_prompts
from ridgeline.step_plan import ScheduledSeq, StepPlan, StepResult
from ridgeline.kv_spec import KVCacheSpec
from ridgeline.layers.forward_context import AttnGroup, ForwardContext, forward_context
from ridgeline.layers.kv_cache import LayerKV, allocate_kv, move_slots
from ridgeline.layers import attention_flash  # noqa: F401  (registers the "flash" backend)
from ridgeline.layers import attention_scores_q  # noqa: F401  (registers "sdpa-scores-int8")
from ridgeline.layers.attention_h2o import slot_attention
from ridgeline.runner.step_sampler import StepSampler
from ridgeline.runner.draft import Draft
from ridgeline.weights.hf_config import ArchConfig

SMALL_DECODE = 16  # steps of at most this many decodes (and nothing else) are prepared in plain Python


class ModelRunner:
    def __init__(self, model: nn.Module, arch: ArchConfig, device: torch.device, kv_spec: KVCacheSpec,
                 num_blocks: int, eos_ids: list[int]):
        self.model, self.arch, self.device = model, arch, device
        self.block_size = kv_spec.block_size
        self.eos_ids = eos_ids
        self.kv: list[LayerKV] = allocate_kv(kv_spec, num_blocks, device)  # per layer, laid out as kv_spec says
        self.layer_paths = model.model.bind_kv(self.kv)  # per layer: None in the C stack, else why modules
        self.kv_groups = kv_spec.groups.num_groups if kv_spec.groups is not None else 1  # tables per sequence
        self.sample = StepSampler(device, eos_ids)
        # attention each cache slot received in a step, where a layer's backend accumulates it (h2o)
        accumulates = any(getattr(layer.self_attn.attn.backend, "accumulates", False)
                          for layer in model.model.held_layers)
        self.attention = torch.zeros(num_blocks * self.block_size, device=device) if accumulates else None
        self.keep_hidden = False  # StepResult.hidden: every row's final hidden state (an EAGLE head reads them)
        self.store = None  # the second KV tier's KVStore (runner/kv_store.py), set by the engine; None: off
        # tensor parallelism, rank 0: leader(method, args) publishes each call that runs the model before it
        # runs, so every rank makes it (distributed/follow.py); None: one process, or a follower
        self.leader = None
        self.pipeline = None  # pipeline parallelism: this stage's distributed.pipeline.PipelineStage
        # per-row additions to Linear outputs (LoRA adapters), set by whoever registers them: an object with
        # knows(name) -> bool and for_step(seqs) -> None or (ForwardContext.delta, its c_delta) (lora/manager.py)
        self.deltas = None

    @torch.inference_mode()
    def execute(self, plan: StepPlan, drafts: dict[str, Draft] | None = None,
                masks: dict[str, list[bytes]] | None = None) -> StepResult:
        """One forward over every scheduled token; logits only for the rows that need them: the last
        num_spec + 1 rows of a sampling sequence (the tokens it keeps), and the prompt rows of a
        request that asked for prompt logprobs. drafts: request id -> the Draft (tokens with their
        draft distribution) its proposals came from; absent for deterministic proposals. masks: request
        id -> the allowed-token bitmask of each of its sampled rows (structured outputs; one process only)."""
        if self.leader is not None:
            self.leader("execute", (plan, drafts))
        self.sample.forget(plan.finished_ids)
        result = StepResult()
        if plan.kv_copies and self.store is not None:  # before the forward: it writes the blocks stored
            result.kv_copy = self.store.run(plan.kv_copies)
        if plan.empty:
            return result
        seqs = plan.seqs
        moves = [m for s in seqs for m in s.kv_moves]
        if moves:  # KV eviction: kept tokens of a tail fill the holes evicted ones left, before any write
            move_slots(self.kv, moves)
        if self.pipeline is not None:  # the same layers, over this stage's range, in micro-batches
            return self.pipeline.execute(self, seqs, result, drafts)
        ids, positions, ctx, sample_rows = self.prepare(seqs)
        if self.deltas is not None:
            ctx.delta, ctx.c_delta = self.deltas.for_step(seqs) or (None, None)
        if self.attention is not None:
            self.attention.zero_()
            ctx.attention = self.attention
        with forward_context(ctx):
            hidden = self.model(ids, positions)
        if self.attention is not None:
            result.kv_attention = slot_attention(self.attention, seqs, self.block_size)
        if self.keep_hidden:
            result.hidden = hidden
        if any(s.score_prompt for s in seqs):
            result.prompt_logprobs = score_prompts(self.model, seqs, hidden)
        sampling = [s for s in seqs if s.sample]
        if sampling:
            rows = hidden if len(sample_rows) == len(hidden) else hidden[sample_rows]  # equal: every row, in order
            # greedy rows (structured ones too, their argmax over what their masks allow): the head and the
            # argmax in one C call, where the head has a C kernel
            tokens = None
            if self.sample.takes_argmax(sampling, masked=True):
                tokens = self.model.greedy_tokens(rows, self.sample.row_masks(sampling, masks))
            if tokens is not None:
                result.sampled = self.sample.matched(sampling, tokens)
            else:
                result.sampled = self.sample(sampling, self.model.compute_logits(rows), drafts, masks)
        return result

    @torch.inference_mode()
    def all_logits(self, seq: ScheduledSeq) -> torch.Tensor:
        """Next-token logits [num_new, vocab] fp32 of every row of one scheduled sequence (its blocks
        allocated by the caller): whole distributions, where prompt logprobs give the top N."""
        if self.leader is not None:
            self.leader("all_logits", (seq,))
        if self.pipeline is not None:
            return self.pipeline.whole(self, seq, "logits")
        return self.model.compute_logits(self._all_hidden(seq)).float()

    @torch.inference_mode()
    def all_hidden(self, seq: ScheduledSeq) -> torch.Tensor:
        """Final (normed) hidden states [num_new, hidden] of every row of one scheduled sequence."""
        if self.leader is not None:
            self.leader("all_hidden", (seq,))
        if self.pipeline is not None:
            return self.pipeline.whole(self, seq, "hidden")
        return self._all_hidden(seq)

    def _all_hidden(self, seq: ScheduledSeq) -> torch.Tensor:
        ids, positions, ctx, _ = self.prepare([seq])
        with forward_context(ctx):
            return self.model(ids, positions)

    @torch.inference_mode()
    def prefill_only(self, req_id: str, ids: list[int], table: list[int], group_tables=()) -> None:
        """Compute ids' KV into the blocks of table (and the other KV groups' tables; allocated by the
        caller), no logits."""
        if self.leader is not None:
            self.leader("prefill_only", (req_id, ids, table))
        seq = ScheduledSeq(req_id, 0, ids, table, False, None, None, None, len(ids), group_tables=list(group_tables))
        if self.pipeline is not None:
            self.pipeline.whole(self, seq, "none")
            return
        ids_t, positions, ctx, _ = self.prepare([seq])
        with forward_context(ctx):
            self.model(ids_t, positions)

    def pipeline_stats(self) -> list | None:
        """Pipeline parallelism: every stage's StageStats, on stage 0 (every stage gathers them together)."""
        if self.leader is not None:
            self.leader("pipeline_stats", ())
        return self.pipeline.gather_stats()

    def reset_pipeline_stats(self) -> None:
        if self.leader is not None:
            self.leader("reset_pipeline_stats", ())
        self.pipeline.reset()

    def prepare(self, seqs: list[ScheduledSeq]):
        for s in seqs if self.kv_groups > 1 else ():  # a missing table would send the C stack out of bounds
            if len(s.group_tables) != self.kv_groups - 1:
                raise ValueError(f"{s.req_id}: {1 + len(s.group_tables)} block tables for {self.kv_groups} KV groups "
                                 "(KVCacheManager.seq_tables gives each group's)")
        if len(seqs) <= SMALL_DECODE and all(s.start >= s.num_prompt_tokens for s in seqs):
            return self._prepare_small(seqs)
        bs, dev = self.block_size, self.device
        n = np.fromiter((s.num_new for s in seqs), np.int64, len(seqs))
        start = np.fromiter((s.start for s in seqs), np.int64, len(seqs))
        cu = np.cumsum(n)
        T = int(cu[-1])
        seq_of = np.repeat(np.arange(len(seqs)), n)
        positions = start[seq_of] + np.arange(T) - (cu - n)[seq_of]
        # KV slots: positions, or with eviction the slots after the request's kept tokens
        start = np.fromiter((s.start if s.cache_start is None else s.cache_start for s in seqs), np.int64, len(seqs))
        ends = start + n
        slot_idx = start[seq_of] + np.arange(T) - (cu - n)[seq_of]
        nb_max = int(-(-ends.max() // bs))
        tables = np.zeros((len(seqs), nb_max), np.int64)
        for i, s in enumerate(seqs):
            nb = -(-int(ends[i]) // bs)
            tables[i, :nb] = s.block_table[:nb]
        slots = tables[seq_of, slot_idx // bs] * bs + slot_idx % bs
        ids = [t for s in seqs for t in s.token_ids]
        decode = np.fromiter((s.is_decode for s in seqs), bool, len(seqs))
        num_decode = int(np.searchsorted(~decode, True))  # decodes come first (the scheduler sorts them)
        assert not decode[num_decode:].any(), "decodes must come first in a step plan"
        prompt = np.fromiter((s.num_prompt_tokens for s in seqs), np.int64, len(seqs))
        groups = []
        if num_decode:
            groups.append(self._group(slice(0, num_decode), n[:num_decode], start[:num_decode],
                                      tables[:num_decode], None))
        if num_decode < len(seqs):
            groups.append(self._group(slice(num_decode, T), n[num_decode:], start[num_decode:],
                                      tables[num_decode:], prompt[num_decode:]))
        positions_t = torch.from_numpy(positions).to(dev)
        ctx = ForwardContext(slot_mapping=torch.from_numpy(slots).to(dev), groups=groups, positions=positions_t)
        if seqs[0].group_tables:
            ctx.kv_groups = self._kv_group_views(seqs, groups, seq_of, slot_idx)
        rows = [r for i, s in enumerate(seqs) if s.sample for r in range(int(cu[i]) - 1 - s.num_spec, int(cu[i]))]
        sample_rows = torch.tensor(rows, dtype=torch.long, device=dev)
        return torch.tensor(ids, dtype=torch.long, device=dev), positions_t, ctx, sample_rows

    def _prepare_small(self, seqs: list[ScheduledSeq]):
        """_prepare of a step of a few sequences past their prompts (decodes, and verifications of
        drafted tokens), in plain Python: the same tensors and groups (the decodes', then the others'
        with a row per token), with a handful of tensor constructions instead of some thirty numpy
        and torch calls. At batch 1 a step's host work runs on caches the decoder stack's weight
        stream has just flushed, where each of those calls costs several microseconds more."""
        bs, dev = self.block_size, self.device
        ids, positions, slots, sample_rows = [], [], [], []
        parts = ([], [])  # per group (decodes, the rest): (seq, slot start, n, table)
        row = 0
        for s in seqs:
            n = len(s.token_ids)
            start = s.start if s.cache_start is None else s.cache_start  # the first new token's slot index
            table = s.block_table[:-(-(start + n) // bs)]
            parts[not s.is_decode].append((s, start, n, table))
            ids += s.token_ids
            positions += range(s.start, s.start + n)
            slots += [table[i // bs] * bs + i % bs for i in range(start, start + n)]
            if s.sample:
                sample_rows += range(row + n - 1 - s.num_spec, row + n)
            row += n
        assert all(s.is_decode for s in seqs[:len(parts[0])]), "decodes must come first in a step plan"
        groups, row = [], 0
        for rest, part in enumerate(parts):
            if not part:
                continue
            nb = max(len(t) for _, _, _, t in part)
            start = np.array([p[1] for p in part], dtype=np.int64)
            n = np.array([p[2] for p in part], dtype=np.int64)
            key_lens = start + n
            group = AttnGroup(rows=slice(row, row + int(n.sum())), start=start, n=n,
                              block_tables=torch.tensor([t + [0] * (nb - len(t)) for _, _, _, t in part],
                                                        dtype=torch.long, device=dev),
                              key_lens=torch.from_numpy(key_lens).to(dev))
            if rest:
                group.row_seq = torch.tensor([i for i, p in enumerate(part) for _ in range(p[2])], dtype=torch.long,
                                             device=dev)
                group.row_key_lens = torch.tensor([k for p in part for k in range(p[1] + 1, p[1] + p[2] + 1)],
                                                  dtype=torch.long, device=dev)
                group.tile_len = torch.tensor([p[0].num_prompt_tokens for p in part], dtype=torch.long, device=dev)
            groups.append(group)
            row += int(n.sum())
        positions_t = torch.tensor(positions, dtype=torch.long, device=dev)
        ctx = ForwardContext(slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev), groups=groups,
                             positions=positions_t)
        if seqs[0].group_tables:
            seq_of = np.repeat(np.arange(len(seqs)), [len(s.token_ids) for s in seqs])
            # parts hold seqs in order (decodes first, asserted above)
            slot_idx = np.concatenate([np.arange(p[1], p[1] + p[2]) for part in parts for p in part])
            ctx.kv_groups = self._kv_group_views(seqs, groups, seq_of, slot_idx)
        return (torch.tensor(ids, dtype=torch.long, device=dev), positions_t, ctx,
                torch.tensor(sample_rows, dtype=torch.long, device=dev))

    def _kv_group_views(self, seqs: list[ScheduledSeq], groups: list[AttnGroup], seq_of: np.ndarray,
                        slot_idx: np.ndarray) -> list[tuple[torch.Tensor, list[AttnGroup]]]:
        """KV groups 1..: each one's slots [T] and attention groups, the same rows and lengths as `groups`
        (which partition seqs in order) over that group's tables. seq_of / slot_idx [T]: each new token's
        sequence and slot index in its table."""
        bs, dev = self.block_size, self.device
        width = max(g.block_tables.shape[1] for g in groups)
        views = []
        for k in range(len(seqs[0].group_tables)):
            tables = np.zeros((len(seqs), width), np.int64)
            for i, s in enumerate(seqs):
                t = s.group_tables[k][:width]
                tables[i, :len(t)] = t
            slots = tables[seq_of, slot_idx // bs] * bs + slot_idx % bs
            out, first = [], 0
            for g in groups:
                rows = tables[first:first + len(g.n), :g.block_tables.shape[1]]
                out.append(replace(g, block_tables=torch.from_numpy(np.ascontiguousarray(rows)).to(dev), derived={}))
                first += len(g.n)
            views.append((torch.from_numpy(slots).to(dev), out))
        return views

    def _group(self, rows: slice, n: np.ndarray, start: np.ndarray, tables: np.ndarray,
               prompt: np.ndarray | None) -> AttnGroup:
        """What every attention backend reads; a backend derives more (SDPA masks) itself if it needs it.
        prompt None: a group of decodes (one row per sequence, past its prompt); else prompt lengths,
        and every row gets its own key length."""
        dev = self.device
        key_lens = start + n
        nb = int(-(-key_lens.max() // self.block_size))
        row_seq = row_key_lens = tile_len = None
        if prompt is not None:
            offsets = np.cumsum(n) - n
            row_seq = np.repeat(np.arange(len(n)), n)
            row_key_lens = start[row_seq] + np.arange(int(n.sum())) - offsets[row_seq] + 1
            row_seq, row_key_lens = torch.from_numpy(row_seq).to(dev), torch.from_numpy(row_key_lens).to(dev)
            tile_len = torch.from_numpy(np.ascontiguousarray(prompt)).to(dev)
        return AttnGroup(rows=rows, start=start, n=n,
                         block_tables=torch.from_numpy(np.ascontiguousarray(tables[:, :nb])).to(dev),
                         key_lens=torch.from_numpy(key_lens).to(dev), row_seq=row_seq, row_key_lens=row_key_lens,
                         tile_len=tile_len)
