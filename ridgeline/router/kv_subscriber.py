"""Follow each replica's KV events (serve/kv_publisher.py has the wire format) into the KV index.

Per replica one SUB socket and one task on the router's event loop. Applied messages must have
consecutive seq from one publisher instance; anything else (joining late, a message dropped past
the high-water mark, a restarted replica) is a gap: the replica's entries are replaced by its
snapshot (GET /kv_events/snapshot) and only later messages are applied."""
from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

from ridgeline.router.kv_index import KVIndex

log = logging.getLogger("ridgeline.router")


def connect_address(endpoint: str, replica_url: str) -> str:
    """The endpoint a replica reports, with a wildcard bind address replaced by the replica's host."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host_port = endpoint[len("tcp://"):]
    host, _, port = host_port.rpartition(":")
    if host in ("*", "0.0.0.0", "[::]", "::"):
        host = urlsplit(replica_url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
    return f"tcp://{host}:{port}"


def decode_events(events: list) -> list[tuple[str, list[bytes]]]:
    return [(kind, [bytes.fromhex(h) for h in hashes]) for kind, hashes in events]


class KVFollower:
    """Applies one replica's messages in order; `resync` is an async callable returning a snapshot."""

    def __init__(self, replica: str, index: KVIndex, resync, on_resync=None):
        self.replica = replica
        self.index = index
        self._resync = resync
        self._on_resync = on_resync
        self.seq: int | None = None  # last applied; None: resync before the next message
        self.instance: str | None = None
        self.resyncs = 0

    async def sync(self) -> None:
        snap = await self._resync()
        self.index.reset(self.replica, [bytes.fromhex(h) for h in snap["hashes"]])
        self.seq, self.instance = snap["seq"], snap.get("instance")
        self.resyncs += 1
        if self._on_resync is not None:
            self._on_resync(self.replica)

    async def handle(self, msg: dict) -> None:
        if self.seq is not None and msg.get("instance") != self.instance:
            self.seq = None  # the replica restarted: its seq began again
        if self.seq is None:
            await self.sync()
        if msg["seq"] <= self.seq:
            return  # already in the snapshot
        if msg["seq"] != self.seq + 1:
            log.info("KV events from %s: gap (seq %d after %d), resyncing", self.replica, msg["seq"], self.seq)
            await self.sync()
            if msg["seq"] <= self.seq:
                return
        self.index.apply(self.replica, decode_events(msg["events"]))
        self.seq = msg["seq"]

    def forget(self) -> None:
        """The replica went down: its blocks are gone from the index; resync when it speaks again."""
        self.index.reset(self.replica)
        self.seq = None


async def follow(endpoint: str, follower: KVFollower) -> None:
    """Receive forever (cancel to stop); a failed resync waits and tries again with the next message."""
    import zmq
    import zmq.asyncio
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.subscribe(b"kv")
    try:
        try:
            await follower.sync()
        except Exception as e:
            log.warning("KV snapshot of %s failed: %s", follower.replica, e)
            follower.seq = None
        while True:
            _, payload = await sock.recv_multipart()
            try:
                await follower.handle(json.loads(payload))
            except Exception as e:  # an unreachable replica: the health check takes it out
                log.warning("KV events from %s: %s", follower.replica, e)
                follower.seq = None
                await asyncio.sleep(0.5)
    finally:
        sock.close(0)
