"""KV connectors: move a request's prompt KV from a prefill engine to a decode engine.

A connector is both ends of one worker: a decode worker `listen()`s (its address goes to whoever
pairs requests), issues transfer ids and files what arrives in its `inbox`; a prefill worker
`prepare()`s a payload on its step thread (a copy out of the pool, before the request's blocks are
freed) and `deliver()`s it from another thread. Delivery is bounded by `timeout` seconds; a failure
raises TransferError and the decode side recomputes.

Every connection is an internal channel (wire.py: the deployment's secret, sequenced tagged frames),
kept open between transfers (sessions.py); one carries one transfer or request at a time:
    front   -> decode  {"op": "expect"}                       <- {"ok": true, "transfer_id": id}
    prefill -> decode  {"op": "kv", header (payload.Header.meta), transport fields}
                                                              <- {"ok": true} or {"ok": false, "reason"}
    prefill -> decode  body: the header's tail (tagged), then the KV bytes (tcp; untagged: the
                       connection is authenticated, and hashing every KV byte would sit on the
                       critical path)                        <- {"ok": true} (filed) or {"ok": false, ...}
The decode side checks the header against its layout and its inbox (an id it issued, its sizes,
the byte budget) before it allocates anything, reads the body by a per-transfer deadline, and
drops a transfer that fails without touching any other.

Registry (`@register_connector`): `tcp` (the bytes follow the tail on the socket) and `shm` (the
sender gathers straight into a POSIX shared-memory segment named after the transfer; the receiver
maps it and unlinks it once the blocks are written): both for one host, tcp across hosts too.

`fault` injects a failure for tests: "drop" fails at once, "stall" blocks until `timeout` (or
`unstall()`), then fails: no timing race decides the outcome."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from ridgeline.disagg.inbox import DEFAULT_INBOX_BYTES, DEFAULT_MAX_EXPECTED, DEFAULT_TTL, Inbox
from ridgeline.disagg.listener import DEFAULT_MAX_CONNECTIONS, AuthListener
from ridgeline.disagg.payload import Header, KVPayload, Layout, check_meta, tail_bytes
from ridgeline.disagg.sessions import SessionPool
from ridgeline.disagg.wire import (LABEL_KV, Refused, at_frame_boundary_closed, by_deadline, check_transfer_id,
                                   parse_address, read_by, recv_json, send_json)
from ridgeline.errors import RidgelineError
from ridgeline.utils import internal_auth

FAULTS = (None, "drop", "stall")
CONNECTORS: dict[str, type[KVConnector]] = {}
IDLE_TIMEOUT = 60.0  # seconds an authenticated connection may wait between two frames


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


@dataclass(frozen=True)
class ReceiveLimits:
    """A decode worker's bounds on what its peers may make it hold."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    inbox_bytes: int = DEFAULT_INBOX_BYTES
    max_expected: int = DEFAULT_MAX_EXPECTED
    ttl: float = DEFAULT_TTL


class KVConnector:
    name = ""

    def __init__(self, timeout: float = 10.0, host: str = "127.0.0.1", port: int = 0, secret: bytes = b"",
                 limits: ReceiveLimits = ReceiveLimits()):
        if len(secret) < internal_auth.MIN_SECRET_BYTES:
            raise ValueError("a KV connector needs the deployment's internal secret")
        self.timeout, self.secret, self.limits = timeout, secret, limits
        self.host, self.port = host, port
        self.inbox = Inbox(limits.ttl, limits.inbox_bytes, limits.max_expected)
        self.layout: Layout | None = None
        self.fault: str | None = None
        self._unstall = threading.Event()
        self._listener: AuthListener | None = None
        self._pool = SessionPool(secret, LABEL_KV, b"prefill", timeout)  # the sending side's connections

    # ---- the decode side -----------------------------------------------------------------------
    def listen(self, layout: Layout) -> str:
        """Start receiving transfers that fit `layout`; returns this connector's address (scheme://host:port)."""
        if self._listener is None:
            self.layout = layout
            self._listener = AuthListener(f"kv-{self.name}", LABEL_KV, self.secret, self.host, self.port,
                                          self._serve, self.limits.max_connections).start()
        return self.address

    @property
    def address(self) -> str | None:
        if self._listener is None:
            return None
        host, port = self._listener.address
        return f"{self.name}://{host}:{port}"

    def _serve(self, session: internal_auth.Session, peer) -> None:
        """One authenticated connection: its frames until it closes; a refusal ends it."""
        while True:
            session.sock.settimeout(IDLE_TIMEOUT)
            if at_frame_boundary_closed(session.sock):
                return
            meta = recv_json(session)
            op = meta.get("op")
            if op == "expect":
                try:
                    send_json(session, {"ok": True, "transfer_id": self.inbox.expect()})
                except Refused as e:
                    send_json(session, {"ok": False, "reason": e.message})
                    raise
            elif op == "abandon":
                self.inbox.abandon(check_transfer_id(meta.get("transfer_id")))
                send_json(session, {"ok": True})
            elif op == "kv":
                self._receive(session, meta, peer)
            else:
                raise Refused(f"unknown op {str(op)[:40]!r}")

    def _receive(self, session: internal_auth.Session, raw: dict, peer) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            meta = check_meta(raw, self.layout)
            fields = self.check_fields(raw, meta)
            give_back = self.inbox.reserve(meta["transfer_id"], meta["nbytes"])
        except Refused as e:
            send_json(session, {"ok": False, "reason": e.message})
            raise
        send_json(session, {"ok": True})
        try:
            payload = self._receive_body(session, meta, fields, deadline, give_back)
        except BaseException as e:
            give_back()
            self.inbox.fail(meta["transfer_id"])
            if isinstance(e, (OSError, ConnectionError)):
                raise Refused(f"transfer {meta['transfer_id']} did not arrive whole: {e}") from None
            raise
        if self.inbox.put(payload):
            send_json(session, {"ok": True})
            return
        why = f"transfer {meta['transfer_id']} came after its request stopped waiting"
        self._listener.rejections(peer, why)
        send_json(session, {"ok": False, "reason": why})

    def _receive_body(self, session, meta: dict, fields: dict, deadline: float, give_back) -> KVPayload:
        want = tail_bytes(meta) + self.body_bytes(meta)
        by_deadline(session.sock, deadline)
        n, tag = session.recv_header(want)
        if n != want:
            raise Refused(f"a body of {n} bytes for transfer {meta['transfer_id']}, whose header announced {want}")
        tail = read_by(session.sock, tail_bytes(meta), deadline)
        session.check(n, tag, tail)
        header = Header.from_wire(meta, tail)
        data, release = self.receive_bytes(session.sock, meta, fields, deadline)

        def release_all() -> None:
            try:
                if release is not None:
                    release()
            finally:
                give_back()
        return KVPayload(header, data, release_all, authenticated=True)

    # what a transport adds (tcp: bytes on the socket; shm: a segment) -----------------------------
    def check_fields(self, raw: dict, meta: dict) -> dict:
        """The transport's own header fields, checked; Refused otherwise."""
        return {}

    def body_bytes(self, meta: dict) -> int:
        """Untagged bytes that follow the tail on the socket."""
        return 0

    def receive_bytes(self, sock: socket.socket, meta: dict, fields: dict, deadline: float):
        """(data: uint8 [nbytes], its release or None)."""
        raise NotImplementedError

    # ---- the prefill side ----------------------------------------------------------------------
    def prepare(self, header: Header, gather) -> Outgoing:
        """gather(out: np.ndarray | None) -> np.ndarray fills the payload bytes (blocks.gather)."""
        return Outgoing(header, gather(None))

    def deliver(self, out: Outgoing, address: str) -> Delivered:
        """Send a prepared payload to the connector at `address` (over a kept-open connection when one
        is idle); TransferError if it is not filed there within `timeout` seconds. The outgoing buffer
        is given up either way."""
        t0 = time.perf_counter()
        try:
            if self.fault == "drop":
                raise TransferError("KV transfer dropped (injected fault)")
            if self.fault == "stall":
                self._unstall.wait(self.timeout)
                raise TransferError(f"KV transfer timed out after {self.timeout:g}s (injected stall)")
            try:
                host, port = parse_address(address, self.name)
            except Refused as e:
                raise TransferError(f"a {self.name} connector cannot send to {address!r}: {e.message}") from None
            session = self._announce(host, port, address, out)
            try:
                self.send_body(session, out, out.header.tail())
                self._answer(session, address, out)
            except BaseException:
                session.sock.close()
                raise
            self._pool.give(host, port, session)
            self.delivered(out)
        except TransferError:
            self.discard(out)
            raise
        except (OSError, RidgelineError) as e:
            self.discard(out)
            raise TransferError(f"KV transfer to {address} failed: {getattr(e, 'message', e)}") from e
        return Delivered(out.header.nbytes, time.perf_counter() - t0)

    def _announce(self, host: str, port: int, address: str, out: Outgoing) -> internal_auth.Session:
        """A session on which the receiver accepted out's header (once more on a new connection if a
        reused one turns out closed: then the receiver never saw the header)."""
        self._pool.timeout = self.timeout
        for attempt in (0, 1):
            session, reused = self._pool.take(host, port)
            try:
                send_json(session, {"op": "kv", **out.header.meta(), **self.frame_fields(out)})
                self._answer(session, address, out)
                return session
            except (OSError, internal_auth.AuthError):
                session.sock.close()
                if not reused or attempt:
                    raise
            except BaseException:
                session.sock.close()
                raise
        raise AssertionError("unreachable")

    def _answer(self, session, address: str, out: Outgoing) -> None:
        answer = recv_json(session)
        if answer.get("ok") is not True:
            raise TransferError(f"the decode worker at {address} refused the KV of {out.header.transfer_id}: "
                                f"{str(answer.get('reason'))[:200]}")

    def frame_fields(self, out: Outgoing) -> dict:
        return {}

    def send_body(self, session: internal_auth.Session, out: Outgoing, tail: bytes) -> None:
        session.send(tail)

    def delivered(self, out: Outgoing) -> None:
        """The receiver owns what it was sent."""

    def discard(self, out: Outgoing) -> None:
        """Give up an undelivered payload's buffer."""

    def unstall(self) -> None:
        self._unstall.set()

    def close(self) -> None:
        self._unstall.set()
        self._pool.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.inbox.close()


def request_transfer(pool: SessionPool, address: str) -> str:
    """A new transfer id from the decode worker whose connector is at `address` (any scheme), over a
    pool of LABEL_KV sessions; TransferError if it does not issue one."""
    try:
        host, port = parse_address(address, address.partition("://")[0])
        answer = pool.call(host, port, {"op": "expect"})
        if answer.get("ok") is not True:
            raise TransferError(f"the decode worker at {address} issues no transfer: {str(answer.get('reason'))[:200]}")
        return check_transfer_id(answer.get("transfer_id"))
    except (OSError, RidgelineError) as e:
        if isinstance(e, TransferError):
            raise
        raise TransferError(f"no transfer id from {address}: {getattr(e, 'message', e)}") from e


def abandon_transfer(pool: SessionPool, address: str, transfer_id: str) -> None:
    """Tell the decode worker at `address` that transfer_id will not come (best effort)."""
    try:
        host, port = parse_address(address, address.partition("://")[0])
        pool.call(host, port, {"op": "abandon", "transfer_id": transfer_id})
    except (OSError, RidgelineError):
        pass  # it expires on its own
