"""The internal channels of a disaggregated deployment, on utils/internal_auth.py: every connection
starts with the mutual handshake (the deployment's secret), then carries sequenced, tagged frames.

- `LABEL_KV`: a decode worker's KV connector (connector.py). The front asks it for a transfer id
  (`{"op": "expect"}`), a prefill worker delivers that transfer's KV (`{"op": "kv", ...}`).
- `LABEL_PREFILL`: a prefill worker's internal endpoint (prefill_server.py): the front's
  `{"op": "prefill", ...}` requests.

A control frame is a JSON object, all of it tagged, at most MAX_HEADER bytes (refused before anything
is allocated for it). Transfer ids are issued by the decode worker that will adopt the transfer:
32 lowercase hex digits; a shared-memory segment is named after its transfer (`rlkv-<id>`).

Refusals are logged, one WARNING line each naming the peer and the reason (`Rejections`)."""
from __future__ import annotations

import json
import logging
import re
import secrets
import socket
import threading
import time

from ridgeline.errors import RidgelineError
from ridgeline.utils import internal_auth

log = logging.getLogger("ridgeline.disagg")

LABEL_KV = "ridgeline-disagg-kv"
LABEL_PREFILL = "ridgeline-disagg-prefill"
MAX_HEADER = 64 * 1024  # bytes of one control frame (a KV header: ids and sizes, never the prompt)
_TRANSFER_ID = re.compile(r"[0-9a-f]{32}")
_SHM_NAME = re.compile(r"rlkv-[0-9a-f]{32}")


class Refused(RidgelineError):
    """A peer's frame on an internal channel was refused (the reason is logged and, where the
    connection still allows, answered)."""


def new_transfer_id() -> str:
    return secrets.token_hex(16)


def check_transfer_id(value) -> str:
    if not isinstance(value, str) or not _TRANSFER_ID.fullmatch(value):
        raise Refused(f"transfer id {str(value)[:40]!r} is not 32 lowercase hex digits")
    return value


def shm_name(transfer_id: str) -> str:
    """The one name the shared-memory segment of a transfer may have."""
    name = f"rlkv-{check_transfer_id(transfer_id)}"
    assert _SHM_NAME.fullmatch(name)
    return name


def parse_address(address: str, scheme: str) -> tuple[str, int]:
    """(host, port) of `scheme://host:port`; Refused for anything else."""
    if not isinstance(address, str):
        raise Refused("an address must be a string")
    got, sep, where = address.partition("://")
    host, _, port = where.rpartition(":")
    if not sep or got != scheme or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise Refused(f"{address[:80]!r} is not a {scheme}://host:port address")
    return host.strip("[]"), int(port)


def send_json(session: internal_auth.Session, obj: dict) -> None:
    session.send(json.dumps(obj, separators=(",", ":")).encode())


def recv_json(session: internal_auth.Session, cap: int = MAX_HEADER) -> dict:
    """The next frame, a JSON object of at most `cap` bytes; AuthError or Refused otherwise."""
    body = session.recv(cap)
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Refused("a control frame is not JSON") from None
    if not isinstance(obj, dict):
        raise Refused("a control frame is not a JSON object")
    return obj


def at_frame_boundary_closed(sock: socket.socket) -> bool:
    """True once the peer closed the connection between two frames, or left it idle past the socket's
    timeout (then this side closes it); False when the next frame's first byte is there."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (ConnectionError, socket.timeout):
        return True


def call(host: str, port: int, secret: bytes, label: str, request: dict, timeout: float,
         answer_timeout: float | None = None, cap: int = MAX_HEADER, hello: bytes = b"") -> dict:
    """One request on a new authenticated connection, and its answer (waited for up to answer_timeout
    seconds, `timeout` by default). OSError, AuthError or Refused on failure."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = internal_auth.connect(sock, secret, label, timeout, hello)
        sock.settimeout(timeout)
        send_json(session, request)
        sock.settimeout(answer_timeout or timeout)
        return recv_json(session, cap)


def by_deadline(sock: socket.socket, deadline: float) -> None:
    """The socket's timeout set to what is left before `deadline` (monotonic); Refused past it."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise Refused("the transfer's deadline passed")
    sock.settimeout(left)


def read_by(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray(n)
    read_into_by(sock, memoryview(buf), deadline)
    return bytes(buf)


def read_into_by(sock: socket.socket, view: memoryview, deadline: float) -> None:
    """Fill view from sock, all of it before `deadline`; Refused past it or if the peer closes first."""
    got = 0
    while got < len(view):
        by_deadline(sock, deadline)
        try:
            k = sock.recv_into(view[got:], min(len(view) - got, 1 << 22))
        except socket.timeout:
            raise Refused("the transfer's deadline passed") from None
        if k == 0:
            raise Refused("the connection closed mid-transfer")
        got += k


def peer_name(peer) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class Rejections:
    """One WARNING line per refusal on a channel ("<channel>: refused <peer>: <reason>"), at most
    `burst` lines per `window` seconds; the lines held back are counted in the next one."""

    def __init__(self, channel: str, burst: int = 50, window: float = 10.0):
        self.channel, self.burst, self.window = channel, burst, window
        self._lock = threading.Lock()
        self._start, self._lines, self._held = 0.0, 0, 0
        self.count = 0

    def __call__(self, peer, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            if now - self._start > self.window:
                self._start, self._lines = now, 0
            if self._lines >= self.burst:
                self._held += 1
                return
            self._lines += 1
            held, self._held = self._held, 0
        more = f" ({held} more refusals not logged)" if held else ""
        log.warning("%s: refused %s: %s%s", self.channel, peer_name(peer), reason, more)
