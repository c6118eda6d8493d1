"""KV connectors: move a request's prompt KV from a prefill engine to a decode engine.

A connector is both ends of one worker: a decode worker `listen()`s (its address goes to whoever
pairs requests) and files what arrives in its `inbox`; a prefill worker `prepare()`s a payload on
its step thread (a copy out of the pool, before the request's blocks are freed) and `deliver()`s it
from another thread. Every transport frames a transfer the same way over one TCP connection:
b"RLKV", a 4-byte header length, the JSON header (payload.Header plus transport fields), then the
transport's part; the receiver answers one byte, b"K" (filed) or b"R" (refused). Delivery is
bounded by `timeout` seconds; a failure raises TransferError and the decode side recomputes.

Registry (`@register_connector`): `tcp` (the bytes follow the header on the socket) and `shm` (the
sender gathers straight into a POSIX shared-memory segment and sends its name; the receiver maps it
and unlinks it once the blocks are written): both for one host, tcp across hosts too.

`fault` injects a failure for tests: "drop" fails at once, "stall" blocks until `timeout` (or
`unstall()`), then fails: no timing race decides the outcome."""
from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

from ridgeline.disagg.inbox import Inbox
from ridgeline.disagg.payload import Header, KVPayload
from ridgeline.errors import RidgelineError

MAGIC = b"RLKV"
FAULTS = (None, "drop", "stall")
CONNECTORS: dict[str, type[KVConnector]] = {}


class TransferError(RidgelineError):
    """A KV transfer did not reach its decode worker (it then recomputes the prompt)."""


def register_connector(name: str):
    def deco(cls):
        cls.name = name
        CONNECTORS[name] = cls
        return cls
    return deco


@dataclass
class Outgoing:
    """A payload ready to deliver: its header and its bytes (owned by the transport until delivered)."""
    header: Header
    data: np.ndarray
    handle: object = None  # transport state (shm: the segment)


@dataclass(frozen=True)
class Delivered:
    nbytes: int
    seconds: float  # connect, send and the receiver's acknowledgement


class KVConnector:
    name = ""

    def __init__(self, timeout: float = 10.0, host: str = "127.0.0.1", port: int = 0, ttl: float = 120.0):
        self.timeout = timeout
        self.host, self.port = host, port
        self.inbox = Inbox(ttl)
        self.fault: str | None = None
        self._unstall = threading.Event()
        self._server: socketserver.ThreadingTCPServer | None = None

    # ---- the decode side -----------------------------------------------------------------------
    def listen(self) -> str:
        """Start receiving; returns this connector's address (scheme://host:port)."""
        if self._server is None:
            owner = self

            class Handler(socketserver.BaseRequestHandler):
                def handle(self):
                    owner._receive(self.request)

            socketserver.ThreadingTCPServer.allow_reuse_address = True
            self._server = socketserver.ThreadingTCPServer((self.host, self.port), Handler)
            self._server.daemon_threads = True
            threading.Thread(target=self._server.serve_forever, name=f"kv-{self.name}", daemon=True).start()
        return self.address

    @property
    def address(self) -> str | None:
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return f"{self.name}://{host}:{port}"

    def _receive(self, sock: socket.socket) -> None:
        sock.settimeout(self.timeout)
        try:
            if _read(sock, 4) != MAGIC:
                return
            (n,) = struct.unpack("<I", _read(sock, 4))
            meta = json.loads(_read(sock, n))
            payload = self.receive_payload(sock, Header.decode(json.dumps(meta["header"])), meta)
        except (OSError, ValueError, KeyError, TransferError):
            return  # the sender sees no acknowledgement and reports the failure
        ok = self.inbox.put(payload)
        sock.sendall(b"K" if ok else b"R")

    def receive_payload(self, sock: socket.socket, header: Header, meta: dict) -> KVPayload:
        raise NotImplementedError

    # ---- the prefill side ----------------------------------------------------------------------
    def prepare(self, header: Header, gather) -> Outgoing:
        """gather(out: np.ndarray | None) -> np.ndarray fills the payload bytes (blocks.gather)."""
        return Outgoing(header, gather(None))

    def deliver(self, out: Outgoing, address: str) -> Delivered:
        """Send a prepared payload to the connector at `address`; TransferError if it is not filed
        there within `timeout` seconds. The outgoing buffer is given up either way."""
        t0 = time.perf_counter()
        try:
            if self.fault == "drop":
                raise TransferError("KV transfer dropped (injected fault)")
            if self.fault == "stall":
                self._unstall.wait(self.timeout)
                raise TransferError(f"KV transfer timed out after {self.timeout:g}s (injected stall)")
            scheme, _, where = address.partition("://")
            if scheme != self.name:
                raise TransferError(f"a {self.name} connector cannot send to {address}")
            host, _, port = where.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=self.timeout) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                meta = json.dumps({"header": json.loads(out.header.encode()), **self.frame_fields(out)}).encode()
                sock.sendall(MAGIC + struct.pack("<I", len(meta)) + meta)
                self.send_body(sock, out)
                if _read(sock, 1) != b"K":
                    raise TransferError(f"the decode worker at {address} refused the KV of {out.header.transfer_id}")
                self.delivered(out)
        except TransferError:
            self.discard(out)
            raise
        except (OSError, ValueError) as e:
            self.discard(out)
            raise TransferError(f"KV transfer to {address} failed: {e}") from e
        return Delivered(out.header.nbytes, time.perf_counter() - t0)

    def frame_fields(self, out: Outgoing) -> dict:
        return {}

    def send_body(self, sock: socket.socket, out: Outgoing) -> None:
        pass

    def delivered(self, out: Outgoing) -> None:
        """The receiver owns what it was sent."""

    def discard(self, out: Outgoing) -> None:
        """Give up an undelivered payload's buffer."""

    def unstall(self) -> None:
        self._unstall.set()

    def close(self) -> None:
        self._unstall.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.inbox.close()


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _read_into(sock, memoryview(buf))
    return bytes(buf)


def _read_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise TransferError("the connection closed mid-transfer")
        got += k
