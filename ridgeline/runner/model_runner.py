"""Turns a StepPlan into tensors, runs one forward over all scheduled tokens, samples."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ridgeline.engine.step_plan import ScheduledSeq, StepPlan
from ridgeline.kv_spec import KVCacheSpec
from ridgeline.layers.forward_context import AttnGroup, ForwardContext, forward_context
from ridgeline.layers.kv_cache import LayerKV, allocate_kv
from ridgeline.layers.sampler import Sampler, SamplingMetadata
from ridgeline.weights.hf_config import ArchConfig


@dataclass
class SampledToken:
    req_id: str
    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None


class ModelRunner:
    def __init__(self, model: nn.Module, arch: ArchConfig, device: torch.device, kv_spec: KVCacheSpec,
                 num_blocks: int, eos_ids: list[int]):
        self.model, self.arch, self.device = model, arch, device
        self.block_size = kv_spec.block_size
        self.eos_ids = eos_ids
        self.kv_cache = allocate_kv(kv_spec, num_blocks, device)  # kv_spec.shape(num_blocks)
        kvs = [LayerKV(self.kv_cache[i, 0], self.kv_cache[i, 1], kv_spec.format.name) for i in range(arch.num_layers)]
        self.layer_paths = model.model.bind_kv(kvs)  # per layer: None in the C stack, else why modules
        self.sampler = Sampler()
        self.generators: dict[str, torch.Generator] = {}

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> list[SampledToken]:
        for rid in plan.finished_ids:
            self.generators.pop(rid, None)
        if plan.empty:
            return []
        seqs = plan.seqs
        ids, positions, ctx, sample_rows = self._prepare(seqs)
        with forward_context(ctx):
            hidden = self.model(ids, positions)
        sampling = [s for s in seqs if s.sample]
        if not sampling:
            return []
        logits = self.model.compute_logits(hidden[sample_rows])
        return self._sample(sampling, logits)

    def _prepare(self, seqs: list[ScheduledSeq]):
        bs, dev = self.block_size, self.device
        n = np.fromiter((s.num_new for s in seqs), np.int64, len(seqs))
        start = np.fromiter((s.start for s in seqs), np.int64, len(seqs))
        ends = start + n
        cu = np.cumsum(n)
        T = int(cu[-1])
        seq_of = np.repeat(np.arange(len(seqs)), n)
        positions = start[seq_of] + np.arange(T) - (cu - n)[seq_of]
        nb_max = int(-(-ends.max() // bs))
        tables = np.zeros((len(seqs), nb_max), np.int64)
        for i, s in enumerate(seqs):
            nb = -(-int(ends[i]) // bs)
            tables[i, :nb] = s.block_table[:nb]
        slots = tables[seq_of, positions // bs] * bs + positions % bs
        ids = [t for s in seqs for t in s.token_ids]
        num_decode = int(np.searchsorted(n != 1, True))  # decodes (1 new token) come first
        groups = []
        if num_decode:
            groups.append(self._group(slice(0, num_decode), n[:num_decode], start[:num_decode],
                                      tables[:num_decode]))
        if num_decode < len(seqs):
            groups.append(self._group(slice(num_decode, T), n[num_decode:], start[num_decode:],
                                      tables[num_decode:]))
        ctx = ForwardContext(slot_mapping=torch.from_numpy(slots).to(dev), groups=groups)
        sample_rows = torch.from_numpy(cu[[i for i, s in enumerate(seqs) if s.sample]] - 1).to(dev)
        return (torch.tensor(ids, dtype=torch.long, device=dev), torch.from_numpy(positions).to(dev),
                ctx, sample_rows)

    def _group(self, rows: slice, n: np.ndarray, start: np.ndarray, tables: np.ndarray) -> AttnGroup:
        """What every attention backend reads; a backend derives more (SDPA masks) itself if it needs it."""
        dev = self.device
        key_lens = start + n
        nb = int(-(-key_lens.max() // self.block_size))
        row_seq = row_key_lens = None
        if int(n.max()) > 1:
            offsets = np.cumsum(n) - n
            row_seq = np.repeat(np.arange(len(n)), n)
            row_key_lens = start[row_seq] + np.arange(int(n.sum())) - offsets[row_seq] + 1
            row_seq, row_key_lens = torch.from_numpy(row_seq).to(dev), torch.from_numpy(row_key_lens).to(dev)
        return AttnGroup(rows=rows, start=start, n=n,
                         block_tables=torch.from_numpy(np.ascontiguousarray(tables[:, :nb])).to(dev),
                         key_lens=torch.from_numpy(key_lens).to(dev), row_seq=row_seq, row_key_lens=row_key_lens)

    def _sample(self, seqs: list[ScheduledSeq], logits: torch.Tensor) -> list[SampledToken]:
        gens = []
        for s in seqs:
            g = None
            if s.seed is not None and not s.params.greedy:
                g = self.generators.get(s.req_id)
                if g is None:
                    g = self.generators[s.req_id] = torch.Generator(self.device).manual_seed(s.seed)
            gens.append(g)
        need_tokens = any(s.params.repetition_penalty != 1 or s.params.presence_penalty
                          or s.params.frequency_penalty or s.params.min_tokens for s in seqs)
        prompts = [s.all_token_ids[:s.num_prompt_tokens] if need_tokens else [] for s in seqs]
        outputs = [s.all_token_ids[s.num_prompt_tokens:] if need_tokens else [] for s in seqs]
        meta = SamplingMetadata.build([s.params for s in seqs], prompts, outputs, gens, self.eos_ids,
                                      logits.shape[-1], self.device)
        out = self.sampler(logits, meta)
        token_ids = out.token_ids.tolist()
        result = [SampledToken(s.req_id, t) for s, t in zip(seqs, token_ids)]
        if out.logprobs is not None:
            lp = out.logprobs.tolist()
            top_lp, top_ids = out.top_logprobs.tolist(), out.top_ids.tolist()
            for i, (s, r) in enumerate(zip(seqs, result)):
                if s.params.logprobs is not None:
                    k = s.params.logprobs
                    r.logprob = lp[i]
                    r.top = list(zip(top_ids[i][:k], top_lp[i][:k]))
        return result
