"""The router's state: replicas, the policy, the KV index and its followers, health checks.

Everything here runs on the router's event loop (one thread): replicas' counters and the index need
no locks."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass

import httpx

from ridgeline.http.errors import ApiError
from ridgeline.http.front_limits import FrontLimits, auth_headers
from ridgeline.router.kv_index import KVIndex
from ridgeline.router.kv_subscriber import KVFollower, connect_address, follow
from ridgeline.router.metrics import RouterMetrics
from ridgeline.router.policy import Route, create_policy
from ridgeline.router.prompt_hash import PromptHasher
from ridgeline.router.replica import Replica, Ticket

log = logging.getLogger("ridgeline.router")


@dataclass(frozen=True)
class RouterSettings:
    policy: str = "cache-aware"
    health_interval: float = 2.0  # seconds between health checks of every replica
    connect_timeout: float = 5.0
    replica_api_key: str | None = None  # sent to replicas on every call (proxied requests, /health, /info, ...)
    limits: FrontLimits = FrontLimits()  # the router's own front: its API key, body and connection limits
    slack: float = 0.5  # cache-aware: above (1 + slack) x mean load a replica loses its affinity
    quiet: bool = False


class Router:
    def __init__(self, replicas: list[Replica], settings: RouterSettings, hasher: PromptHasher | None = None):
        self.replicas = replicas
        self.by_name = {r.name: r for r in replicas}
        self.settings = settings
        self.index = KVIndex() if settings.policy == "cache-aware" else None
        self.policy = create_policy(settings.policy, self.index, slack=settings.slack)
        self.hasher = hasher
        self.metrics = RouterMetrics(replicas)
        self.followers: dict[str, KVFollower] = {}
        self._tasks: list[asyncio.Task] = []
        self.client: httpx.AsyncClient | None = None
        # replicas the router launched: url -> why it is gone (its process exited), or None; polled often
        self.exit_reason = None

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        # every call to a replica carries the replicas' key (clients' Authorization headers never go through)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=self.settings.connect_timeout),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                                        headers=auth_headers(self.settings.replica_api_key))
        if self.index is not None:
            for r in self.replicas:
                self._follow(r)
        self._tasks.append(asyncio.ensure_future(self._health_loop()))
        if self.exit_reason is not None:
            self._tasks.append(asyncio.ensure_future(self._exit_loop()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self.client is not None:
            await self.client.aclose()

    def _follow(self, r: Replica) -> None:
        endpoint = r.info.get("kv_events_endpoint")
        if not endpoint:
            return
        follower = KVFollower(r.name, self.index, lambda: self.get_json(r, "/kv_events/snapshot"),
                              lambda name: self.metrics.kv_resyncs.labels(name).inc())
        self.followers[r.name] = follower
        self._tasks.append(asyncio.ensure_future(follow(connect_address(endpoint, r.url), follower)))

    async def get_json(self, r: Replica, path: str) -> dict:
        resp = await self.client.get(r.url + path)
        resp.raise_for_status()
        return resp.json()

    # ---- routing -----------------------------------------------------------------------------
    def up(self) -> list[Replica]:
        return [r for r in self.replicas if r.up]

    def pick(self, route: Route, exclude: set[str]) -> Replica:
        candidates = [r for r in self.replicas if r.up and r.name not in exclude]
        if not candidates:
            down = "; ".join(f"{r.url}: {r.reason}" for r in self.replicas if not r.up)
            raise ApiError(503, "no replica is available to serve this request" + (f" ({down})" if down else ""),
                           code="no_replica_available")
        return self.policy.choose(candidates, route)

    def admit(self, replica: Replica, route: Route) -> Ticket:
        hit = min(self.policy.expected_hit(replica, route), max(route.num_tokens - 1, 0))
        self.metrics.expected_hits.inc(hit)
        on_end = None
        if self.index is not None and route.hashes:
            self.index.expect(replica.name, route.hashes)
            on_end = functools.partial(self.index.settle, replica.name, route.hashes)
        return Ticket(replica, route.num_tokens - hit, hit, on_end)

    def mark_down(self, replica: Replica, reason: str) -> None:
        if replica.mark_down(reason):
            log.warning("replica %s is out of rotation: %s", replica.url, reason)
            self.metrics.replica_failures.labels(replica.url).inc()
            follower = self.followers.get(replica.name)
            if follower is not None:
                follower.forget()

    # ---- health ------------------------------------------------------------------------------
    async def check(self, r: Replica) -> None:
        try:
            resp = await self.client.get(r.url + "/health", timeout=max(self.settings.health_interval, 1.0))
        except httpx.HTTPError as e:
            self.mark_down(r, f"health check failed: {type(e).__name__}")
            return
        if resp.status_code != 200:
            self.mark_down(r, f"health check answered HTTP {resp.status_code}")
        elif not r.up and (self.exit_reason is None or self.exit_reason(r.url) is None):
            r.mark_up()
            log.warning("replica %s is back in rotation", r.url)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(r) for r in self.replicas))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval)
            await self.check_all()

    async def _exit_loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            for r in self.replicas:
                reason = self.exit_reason(r.url)
                if reason is not None:
                    self.mark_down(r, reason)

    async def replica_metrics(self) -> list[str]:
        async def one(r: Replica) -> str | None:
            try:
                resp = await self.client.get(r.url + "/metrics")
                return resp.text if resp.status_code == 200 else None
            except httpx.HTTPError:
                return None
        texts = await asyncio.gather(*(one(r) for r in self.up()))
        return [t for t in texts if t is not None]
