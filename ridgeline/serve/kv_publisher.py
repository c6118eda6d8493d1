"""A replica's KV events on a ZeroMQ PUB socket (`--kv-events-endpoint`), and the snapshot a
subscriber resyncs from (GET /kv_events/snapshot).

Wire format (documented in README "Replicas and routing"), one two-frame message per engine step
that changed the prefix cache:
  frame 0: b"kv"  (the topic)
  frame 1: JSON {"instance": I, "seq": N, "block_size": B,
                 "events": [["stored" | "removed", [hex hash, ...]], ...]}
seq counts messages from 1 without holes; instance is new each time a replica starts. A subscriber
that sees seq jump or instance change (it joined late, fell behind the socket's high-water mark, or
the replica restarted) fetches the snapshot, {"instance": I, "seq": N, "block_size": B,
"hashes": [hex hash, ...]}: the hashes held once message N is applied; it then applies only
messages after N. Hashes are engine/prefix_cache.py's block hashes
(SHA-256, hex): a router computes the same from token ids.

ZeroMQ PUB has no authentication: whoever reaches the endpoint reads which prompt prefixes are
cached. A tcp:// endpoint on a wildcard or non-loopback address is allowed, with a warning.
"""
from __future__ import annotations

import json
import os
import sys
import threading

from ridgeline.engine.kv_events import KVEventRecorder, apply_events
from ridgeline.errors import RidgelineError
from ridgeline.http.front_limits import is_loopback

TOPIC = b"kv"


class KVEventPublisher:
    """publish() runs on the engine's step thread only (the socket's one user); snapshot() on any."""

    def __init__(self, endpoint: str, block_size: int):
        try:
            import zmq
        except ImportError:
            raise RidgelineError("--kv-events-endpoint needs pyzmq: pip install 'ridgeline[router]'") from None
        self.recorder = KVEventRecorder()
        self.block_size = block_size
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise RidgelineError(f"cannot publish KV events on {endpoint}: {e}") from None
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)  # port 0 / wildcards resolved
        warning = endpoint_warning(endpoint)
        if warning is not None:
            print(warning, file=sys.stderr, flush=True)
        self._noblock = zmq.NOBLOCK
        self._again = zmq.Again
        self._lock = threading.Lock()  # seq and held change together
        self.seq = 0
        self.instance = os.urandom(6).hex()
        self.held: set[bytes] = set()  # what a subscriber holds after message `seq`

    def publish(self) -> None:
        events = self.recorder.drain()
        if not events:
            return
        with self._lock:
            self.seq += 1
            apply_events(self.held, events)
            body = {"instance": self.instance, "seq": self.seq, "block_size": self.block_size,
                    "events": [[kind, [h.hex() for h in hashes]] for kind, hashes in events]}
        try:  # PUB never blocks: past the high-water mark a slow subscriber misses it and resyncs
            self._sock.send_multipart([TOPIC, json.dumps(body, separators=(",", ":")).encode()], self._noblock)
        except self._again:
            pass

    def snapshot(self) -> dict:
        with self._lock:
            return {"instance": self.instance, "seq": self.seq, "block_size": self.block_size,
                    "hashes": [h.hex() for h in self.held]}

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()


def endpoint_warning(endpoint: str) -> str | None:
    """What to say about publishing on `endpoint` as given (ipc:// and loopback tcp:// say nothing)."""
    if not endpoint.startswith("tcp://"):
        return None
    host = endpoint[len("tcp://"):].rpartition(":")[0]
    if is_loopback(host):
        return None
    where = "every interface" if host.strip("[]") in ("*", "0.0.0.0", "::") else host
    return (f"warning   --kv-events-endpoint {endpoint} publishes KV events on {where} without authentication: "
            "whoever reaches it reads which prompt prefixes are cached (use ipc:// or tcp://127.0.0.1 unless "
            "the network is private)")
