"""Where a busy engine's time between steps goes, with counters that hold under load.

An interval runs from the start of one step to the start of the next while the engine had work in
between (an idle engine's wait for a request is not counted). Over the intervals it sums:
- the wall time (what a running request's time per output token is made of, one token a step);
- the step thread's CPU time (time.thread_time), split into adopting transferred KV (disaggregation),
  the model's forward and the rest (scheduling, sampling bookkeeping, detokenizing, handing tokens out);
- the time the step thread was runnable but waited for a core (the kernel's run-queue delay,
  /proc/thread-self/schedstat; 0 where the kernel does not report it).
Wall - CPU - waiting for a core is time the thread was blocked (the GIL, a lock). With more than one
torch thread the forward's other threads' CPU is not in the step thread's: the forward's wall time
is kept too. Steps that ran prompt tokens are counted apart, as they stall the decodes in them."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass, field


class _Schedstat:
    """/proc/thread-self/schedstat of the thread that opened it, kept open (closed with the thread's
    local storage): opening it each step cost ~0.1 ms once the decoder stack's weight stream had
    evicted the path lookup's working set from the caches; a pread of the open file costs a few us."""

    def __init__(self):
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = -1

    def __del__(self):
        if self.fd >= 0:
            os.close(self.fd)


_local = threading.local()


def _runq_s() -> float:
    """The calling thread's run-queue delay so far, in seconds (0 where the kernel does not report it)."""
    f = getattr(_local, "schedstat", None)
    if f is None:
        f = _local.schedstat = _Schedstat()
    if f.fd < 0:
        return 0.0
    try:
        return int(os.pread(f.fd, 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class StepTimes:
    intervals: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    runq_s: float = 0.0
    adopt_cpu_s: float = 0.0
    forward_cpu_s: float = 0.0
    forward_wall_s: float = 0.0
    seqs: int = 0  # sequences stepped, summed over intervals (their mean is the batch)
    prefill_intervals: int = 0  # intervals whose step ran prompt tokens
    prompt_tokens: int = 0  # prompt tokens those steps ran


@dataclass
class StepClock:
    totals: StepTimes = field(default_factory=StepTimes)
    _open: tuple[float, float, float] | None = None  # (wall, cpu, runq) at the start of the step in flight
    _step: StepTimes = field(default_factory=StepTimes)  # the step in flight's own phases
    _mark: tuple[float, float] = (0.0, 0.0)

    def begin(self) -> None:
        """At the start of a step: closes the interval opened by the previous one, if still open."""
        now = (time.perf_counter(), time.thread_time(), _runq_s())
        if self._open is not None:
            t, s = self.totals, self._step
            t.intervals += 1
            t.wall_s += now[0] - self._open[0]
            t.cpu_s += now[1] - self._open[1]
            t.runq_s += now[2] - self._open[2]
            t.adopt_cpu_s += s.adopt_cpu_s
            t.forward_cpu_s += s.forward_cpu_s
            t.forward_wall_s += s.forward_wall_s
            t.seqs += s.seqs
            t.prefill_intervals += s.prefill_intervals
            t.prompt_tokens += s.prompt_tokens
        self._open, self._step = now, StepTimes()

    def mark(self) -> None:
        self._mark = (time.perf_counter(), time.thread_time())

    def adopted(self) -> None:
        self._step.adopt_cpu_s += time.thread_time() - self._mark[1]

    def forwarded(self, plan) -> None:
        s = self._step
        s.forward_wall_s += time.perf_counter() - self._mark[0]
        s.forward_cpu_s += time.thread_time() - self._mark[1]
        s.seqs += len(plan.seqs)
        prompt = sum(len(q.token_ids) for q in plan.seqs if not q.is_decode)
        if prompt:
            s.prefill_intervals += 1
            s.prompt_tokens += prompt

    def end(self, busy: bool) -> None:
        """After a step: an engine left without work closes nothing (its next step starts afresh)."""
        if not busy:
            self._open = None

    def summary(self) -> dict:
        return asdict(self.totals)


def per_interval(t: dict) -> dict | None:
    """Means per interval in milliseconds (and the batch), from a summary; None before two busy steps."""
    n = t.get("intervals", 0)
    if not n:
        return None
    ms = {k: t[k] / n * 1e3 for k in ("wall_s", "cpu_s", "runq_s", "adopt_cpu_s", "forward_cpu_s", "forward_wall_s")}
    other = max(0.0, ms["cpu_s"] - ms["adopt_cpu_s"] - ms["forward_cpu_s"])
    blocked = max(0.0, ms["wall_s"] - ms["cpu_s"] - ms["runq_s"])
    return {"intervals": n, "step_ms": ms["wall_s"], "cpu_ms": ms["cpu_s"], "forward_cpu_ms": ms["forward_cpu_s"],
            "forward_wall_ms": ms["forward_wall_s"], "adopt_cpu_ms": ms["adopt_cpu_s"], "other_cpu_ms": other,
            "runq_ms": ms["runq_s"], "blocked_ms": blocked, "batch": t["seqs"] / n,
            "prefill_share": t["prefill_intervals"] / n, "prompt_tokens": t["prompt_tokens"]}


def format_breakdown(name: str, t: dict) -> str:
    """One line: where `name`'s time between steps went."""
    m = per_interval(t)
    if m is None:
        return f"{name}: no busy steps recorded"
    return (f"{name}: {m['step_ms']:.1f} ms between steps (batch {m['batch']:.1f}, {m['intervals']} steps) = "
            f"CPU {m['cpu_ms']:.1f} (forward {m['forward_cpu_ms']:.1f}, adopting KV {m['adopt_cpu_ms']:.1f}, "
            f"other {m['other_cpu_ms']:.1f}) + waiting for a core {m['runq_ms']:.1f} + blocked {m['blocked_ms']:.1f}; "
            f"{m['prefill_share']:.0%} of steps ran prompt tokens ({m['prompt_tokens']} tokens)")
