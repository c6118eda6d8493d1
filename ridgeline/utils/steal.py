"""CPU time the hypervisor gave to other guests while this machine's virtual CPUs wanted it ("steal",
the eighth column of /proc/stat's `cpu` line), as a share of all CPU time over an interval. On a shared
VM a run that lost part of its CPUs to other guests is slower for reasons outside the engine, and a
parallel step loses more than the stolen share: its threads wait at each barrier for the one that was
descheduled. Benchmarks print it beside their timings so such runs can be told apart."""
from __future__ import annotations

STAT = "/proc/stat"


def read_ticks(path: str = STAT) -> tuple[int, int] | None:
    """(steal ticks, all ticks) summed over the CPUs since boot; None where the kernel does not say."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
    ticks = [int(x) for x in fields[1:9]]
    return ticks[7], sum(ticks)


class StealMeter:
    """Started when made; `fraction()` is the share of all CPU time stolen since then (None: unknown)."""

    def __init__(self, path: str = STAT):
        self.path = path
        self.start = read_ticks(path)

    def fraction(self) -> float | None:
        end = read_ticks(self.path)
        if self.start is None or end is None:
            return None
        total = end[1] - self.start[1]
        return (end[0] - self.start[0]) / total if total > 0 else 0.0
