"""Helpers for the server tests: hold the engine's step loop where the test wants it, and poll a
condition with a generous safety timeout (the timeout is never what a test asserts)."""
from __future__ import annotations

import threading
import time

import httpx

SAFETY_S = 60.0  # only ever reached when something is broken


class StepGate:
    """Holds the server's step loop until the test lets steps through, so "still running when X
    happens" is a fact, not a race. Closed when entered; `allow(k)` lets k steps start, `open()` any
    number. Adds and aborts keep being applied while steps are held (AsyncEngine.step_gate)."""

    def __init__(self, app):
        self.ae = app.state.ridgeline.async_engine
        self._cond = threading.Condition()
        self._budget: int | None = 0  # steps that may start; None: any number
        self.parked = False  # the step thread has work and is held at the gate
        self.passed = 0  # steps let through so far

    def __enter__(self) -> StepGate:
        self.ae.step_gate = self._may_step
        return self

    def __exit__(self, *exc) -> None:
        self.ae.step_gate = None
        self.open()

    def _may_step(self) -> bool:  # on the step thread
        with self._cond:
            if self._budget == 0:
                self.parked = True
                self._cond.notify_all()
                return False
            self.parked = False
            if self._budget is not None:
                self._budget -= 1
            self.passed += 1
            return True

    def allow(self, steps: int = 1) -> None:
        with self._cond:
            self._budget = (self._budget or 0) + steps
        self.ae.wake()

    def open(self) -> None:
        with self._cond:
            self._budget = None
        self.ae.wake()

    def close(self) -> None:
        with self._cond:
            self._budget = 0

    def step(self) -> None:
        """Let exactly one step run, and wait until it is done (the thread is back at the gate, which
        needs a request still unfinished after it)."""
        with self._cond:
            target = self.passed + 1
            self.parked = False
        self.allow(1)
        with self._cond:
            assert self._cond.wait_for(lambda: self.passed >= target and self.parked, SAFETY_S), "step never ran"


def wait_until(condition, what: str = "condition") -> None:
    deadline = time.monotonic() + SAFETY_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} never became true"
        time.sleep(0.01)


def metric(url: str, name: str, labels: str = "", headers: dict | None = None) -> float:
    for line in httpx.get(url + "/metrics", headers=headers).text.splitlines():
        if line.startswith(name + (labels and "{" + labels + "}") + " "):
            return float(line.split()[-1])
    return 0.0


def wait_idle(url: str) -> None:
    wait_until(lambda: not metric(url, "ridgeline_kv_cache_blocks_used")
               and not metric(url, "ridgeline_num_requests_running")
               and not metric(url, "ridgeline_num_requests_waiting"), "KV blocks freed and no request left")
