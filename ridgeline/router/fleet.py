"""Several models behind one endpoint (`ridgeline serve --models a,b,...`): each model is one replica
process, started on the first request that names it and stopped after `keep_alive` seconds without
one; when starting a model would put the loaded models over the memory budget, the least recently used
idle ones are stopped first. Requests are routed by their `model` field; a model's replica is reached
through its own Router (router/core.py: health checks, retries, metrics), whose key only this front
holds.

Everything here runs on the front's event loop: entries need no locks but each one's start lock (two
requests for a model that is not loaded start it once)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("ridgeline.router")


@dataclass
class FleetModel:
    name: str  # what clients put in `model`
    spec: dict  # the replica's spec (router/data_parallel.py replica_spec)
    nbytes: int  # what it holds loaded: its weight files and its KV budget (an estimate)
    router: object | None = None  # its Router while loaded
    launcher: object | None = None  # its ProcessLauncher while loaded
    active: int = 0  # requests in flight
    last_used: float = 0.0  # time.monotonic() of the last request's end (or start)
    loads: int = 0
    keep_alive: float | None = None  # the last request's keep_alive (ollama's), else the fleet's
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def loaded(self) -> bool:
        return self.router is not None


class FleetError(Exception):
    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


def parse_keep_alive(value) -> float:
    """ollama's keep_alive: seconds (a number), or a Go duration ("5m", "1h30m", "-1s"); negative: forever."""
    if isinstance(value, bool):
        raise FleetError(400, "keep_alive must be a number of seconds or a duration such as \"5m\"", "keep_alive")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text)
        try:
            return sign * float(body)
        except ValueError:
            pass
        parts = _DURATION.findall(body)
        if body and "".join(n + u for n, u in parts) == body:
            return sign * sum(float(n) * _UNITS[u] for n, u in parts)
    raise FleetError(400, f"keep_alive {value!r}: a number of seconds or a duration such as \"5m\", \"1h\" or "
                          "\"-1\" (keep loaded)", "keep_alive")


class Fleet:
    """start(spec) -> (launcher, [urls]) and build(urls) -> Router are blocking / async callables (the
    process launcher and router/serve.build_router in production, fakes in tests)."""

    def __init__(self, models: list[FleetModel], keep_alive: float, budget: int | None,
                 start: Callable, build: Callable):
        self.models = {m.name: m for m in models}
        self.keep_alive, self.budget = keep_alive, budget
        self._start, self._build = start, build
        self._reaper: asyncio.Task | None = None

    def get(self, name) -> FleetModel:
        m = self.models.get(name) if isinstance(name, str) else None
        if m is None:
            raise FleetError(404, f"model {name!r} is not served here; served: {', '.join(self.models)}",
                             "model_not_found")
        return m

    async def acquire(self, name) -> FleetModel:
        """The model, loaded (started now if it is not), with one more request in flight."""
        m = self.get(name)
        m.active += 1
        try:
            async with m.lock:
                if not m.loaded:
                    await self._make_room(m)
                    await self._load(m)
        except BaseException:
            m.active -= 1
            raise
        m.last_used = time.monotonic()
        return m

    def keep_of(self, m: FleetModel) -> float:
        """Seconds m stays loaded once idle (negative: forever): its last request's keep_alive, else the fleet's."""
        return self.keep_alive if m.keep_alive is None else m.keep_alive

    def release(self, m: FleetModel) -> None:
        m.active -= 1
        m.last_used = time.monotonic()

    def loaded_bytes(self) -> int:
        return sum(m.nbytes for m in self.models.values() if m.loaded)

    async def _make_room(self, m: FleetModel) -> None:
        if self.budget is None:
            return
        while self.loaded_bytes() + m.nbytes > self.budget:
            idle = [o for o in self.models.values() if o.loaded and o.active == 0 and o is not m]
            if not idle:
                raise FleetError(503, f"model {m.name!r} needs {m.nbytes / 2**30:.2f} GiB and the loaded models "
                                      f"hold {self.loaded_bytes() / 2**30:.2f} GiB of the {self.budget / 2**30:.2f} "
                                      "GiB budget with requests in flight; retry when they finish",
                                 "models_memory_budget")
            victim = min(idle, key=lambda o: o.last_used)  # least recently used
            log.info("unloading %s (least recently used) to make room for %s", victim.name, m.name)
            await self.unload(victim)

    async def _load(self, m: FleetModel) -> None:
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            launcher, urls = await loop.run_in_executor(None, self._start, m.spec)
        except Exception as e:
            raise FleetError(503, f"model {m.name!r} failed to start: {e}", "model_start_failed") from None
        try:
            router = await self._build(urls)
            await router.start()
        except BaseException:
            await loop.run_in_executor(None, launcher.stop)
            raise
        m.router, m.launcher, m.loads = router, launcher, m.loads + 1
        log.info("loaded %s in %.1f s", m.name, time.monotonic() - t0)

    async def unload(self, m: FleetModel) -> None:
        router, launcher = m.router, m.launcher
        m.router = m.launcher = None
        if router is not None:
            with contextlib.suppress(Exception):
                await router.stop()
        if launcher is not None:
            await asyncio.get_running_loop().run_in_executor(None, launcher.stop)

    async def reap_once(self, now: float | None = None) -> list[str]:
        """Unload every loaded model idle for keep_alive seconds; returns their names."""
        now = time.monotonic() if now is None else now
        gone = []
        for m in list(self.models.values()):
            keep = self.keep_of(m)
            if m.loaded and m.active == 0 and 0 <= keep <= now - m.last_used and not m.lock.locked():
                log.info("unloading %s (idle %.0f s)", m.name, now - m.last_used)
                await self.unload(m)
                gone.append(m.name)
        return gone

    async def start(self) -> None:
        async def reap():
            while True:
                await asyncio.sleep(0.25)
                await self.reap_once()
        self._reaper = asyncio.create_task(reap())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for m in self.models.values():
            await self.unload(m)
