"""One pipeline stage's part of a step: the step's sequences split into micro-batches (whole
sequences, in plan order, about equal rows each); per micro-batch the first stage embeds, every
stage runs its layer range through the model's `run_layers` (the C decoder stack where it runs)
and sends (hidden, residual) fp32 [rows, hidden] to the next stage with torch.distributed isend, so
it goes on with the next micro-batch while the next stage computes this one (forward only: no
backward to interleave). The last stage computes logits, samples, and sends the sampled tokens back
to stage 0 (frames.send: wire.py's codec, no pickle), which schedules the next step.

A row's result does not depend on the rows it shares a batch with (the packed matmul sums in a fixed
order, attention runs per row or per sequence), so micro-batching changes no bit of the output.

Timing per stage (StageStats): wall time of each step, time computing (embedding, layers, logits,
sampling), time blocked in point-to-point calls (waiting for the previous stage or for the sampled
tokens, plus the transfers themselves), the transfers alone as the receiver sees them, bytes sent. Bubble fraction = blocked time / step time (what
is neither blocked nor computing is host work: building the micro-batches' tensors)."""
from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from ridgeline.distributed import frames
from ridgeline.distributed.comm import median_seconds
from ridgeline.distributed.pipeline_stats import StageStats
from ridgeline.distributed.plan_check import check_answer
from ridgeline.distributed.stages import Stage, microbatch_count, split_rows
from ridgeline.layers.forward_context import forward_context
from ridgeline.runner.prompt_logprobs import score_prompts
from ridgeline.step_plan import ScheduledSeq, StepResult

log = logging.getLogger(__name__)
LOG_EVERY = 1000  # steps between the first stage's log lines of its own counters


class PipelineStage:
    def __init__(self, stage: Stage, microbatches: int | None, hidden: int, vocab: int, group=None):
        self.stage, self.requested, self.hidden, self.vocab, self.group = stage, microbatches, hidden, vocab, group
        self.stats = StageStats(stage.index, (stage.start, stage.stop))

    def reset(self) -> None:
        self.stats = StageStats(self.stage.index, (self.stage.start, self.stage.stop))

    # ---- point to point ------------------------------------------------------------------------
    def _recv(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        h, r = torch.empty(T, self.hidden), torch.empty(T, self.hidden)
        t0 = time.perf_counter()
        dist.recv(h, self.stage.index - 1, group=self.group)
        t1 = time.perf_counter()
        dist.recv(r, self.stage.index - 1, group=self.group)
        t2 = time.perf_counter()
        self.stats.recv_s += t2 - t0
        self.stats.transfer_s += 2 * (t2 - t1)
        return h, r

    def _send(self, h: torch.Tensor, r: torch.Tensor, pending: list) -> None:
        dst = self.stage.index + 1
        for t in (h.contiguous(), r.contiguous()):
            pending.append((dist.isend(t, dst, group=self.group), t))  # t kept alive until the wait
            self.stats.sent_bytes += t.numel() * t.element_size()

    def _finish_sends(self, pending: list) -> None:
        t0 = time.perf_counter()
        for work, _ in pending:
            work.wait()
        self.stats.send_s += time.perf_counter() - t0

    def _to_first(self, obj):
        """The last stage's answer to stage 0 (the same object on stage 0; None on the others)."""
        st = self.stage
        if st.first and st.last:
            return obj
        if st.last:
            frames.send(obj, 0, group=self.group)  # a few token ids: not counted in sent_bytes
            return None
        if st.first:
            t0 = time.perf_counter()
            answer = frames.recv(st.size - 1, group=self.group)
            self.stats.recv_s += time.perf_counter() - t0
            check_answer(answer, self.vocab)  # its tokens are the next step's inputs
            return answer
        return None

    # ---- a stage's forward -----------------------------------------------------------------------
    def _run(self, runner, seqs: list[ScheduledSeq], pending: list):
        """One micro-batch through this stage's layers. Returns the final normed hidden states on the
        last stage (None elsewhere, where they were sent on)."""
        ids, positions, ctx, rows = runner.prepare(seqs)
        st, model = self.stage, runner.model.model
        if st.first:
            t0 = time.perf_counter()
            h, r = model.embed(ids), None
        else:
            h, r = self._recv(ids.numel())
            t0 = time.perf_counter()
        with forward_context(ctx):
            h, r, _ = model.run_layers(positions, h, r, st.start, st.stop, final_norm=st.last)
        self.stats.compute_s += time.perf_counter() - t0
        self.stats.rows += ids.numel()
        if not st.last:
            self._send(h, r, pending)
            return None, rows
        return h, rows

    def execute(self, runner, seqs: list[ScheduledSeq], result: StepResult, drafts) -> StepResult:
        t0 = time.perf_counter()
        sizes = [s.num_new for s in seqs]
        parts = split_rows(sizes, microbatch_count(self.requested, self.stage.size, len(seqs)))
        pending: list = []
        sampled, scored = [], {}
        for a, b in parts:
            mb = seqs[a:b]
            hidden, rows = self._run(runner, mb, pending)
            if hidden is None:
                continue
            t1 = time.perf_counter()
            if any(s.score_prompt for s in mb):
                scored.update(score_prompts(runner.model, mb, hidden))
            sampling = [s for s in mb if s.sample]
            if sampling:
                sampled += runner.sample(sampling, runner.model.compute_logits(hidden[rows]), drafts)
            self.stats.compute_s += time.perf_counter() - t1
        self._finish_sends(pending)
        answer = self._to_first((sampled, scored) if self.stage.last else None)
        if answer is not None:
            result.sampled, result.prompt_logprobs = answer
        s = self.stats
        s.steps += 1
        s.microbatches += len(parts)
        s.step_s += time.perf_counter() - t0
        if self.stage.first and s.steps % LOG_EVERY == 0:
            log.info("pipeline %s", s.line())
        return result

    def whole(self, runner, seq: ScheduledSeq, what: str) -> torch.Tensor | None:
        """One sequence through every stage outside the scheduler: `what` is "logits" or "hidden" (every
        row's, returned on stage 0) or "none" (KV only)."""
        pending: list = []
        hidden, _ = self._run(runner, [seq], pending)
        self._finish_sends(pending)
        out = None
        if hidden is not None and what != "none":
            out = runner.model.compute_logits(hidden).float() if what == "logits" else hidden
        st = self.stage
        if what == "none" or st.first == st.last:
            return out
        if st.last:
            dist.send(out.contiguous(), 0, group=self.group)
            return None
        if st.first:
            width = runner.arch.vocab_size if what == "logits" else self.hidden
            out = torch.empty(seq.num_new, width)
            dist.recv(out, st.size - 1, group=self.group)
        return out

    def gather_stats(self) -> list[StageStats] | None:
        """Every stage's counters, on stage 0 (None elsewhere); every stage calls it together."""
        out = frames.all_gather(self.stats, group=self.group)
        return out if self.stage.first else None


def probe_p2p(sizes: tuple[int, ...], reps: int, rank: int, group=None) -> list[float]:
    """Median one-way seconds of an fp32 message of each size (floats) from stage 0 to stage 1 and back
    (half the round trip), stages 0 and 1 calling it together: the link's latency and bandwidth, apart
    from any model. Other stages return at once."""
    def round_trip(x) -> float:
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(x, 1, group=group)
            dist.recv(x, 1, group=group)
        elif rank == 1:
            dist.recv(x, 0, group=group)
            dist.send(x, 0, group=group)
        return (time.perf_counter() - t0) / 2

    return median_seconds(sizes, reps, round_trip)
