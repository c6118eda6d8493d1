"""The secret one deployment's processes share, and what is built on it: a mutual challenge-response
when an internal connection opens, and frames bound to that connection, their direction and their
sequence number. Used by every channel Ridgeline's own processes open between them (the parallel
ranks' plan channel, the KV connector between prefill and decode workers).

The secret: a launcher that starts its own children makes a new one per launch (`new_secret`) and
hands it over by environment (`SECRET_ENV`, hex, read once and removed from this process's
environment) or by pipe; processes started apart (torchrun on several machines, workers started by
hand) read the same file (`--internal-secret-file`, readable by its owner only).

Handshake (both sides prove they hold the secret; neither sends it):
    server -> client   MAGIC, label length + label, nonce_s (16 bytes)
    client -> server   nonce_c, hello length (2 bytes) + hello, tag_c = H(secret, "client", label, nonce_s, nonce_c, hello)
    server -> client   tag_s = H(secret, "server", label, nonce_s, nonce_c, hello)
Session key = H(secret, "session", label, nonce_s, nonce_c, hello): fresh for every connection, so a frame
recorded on one connection is refused on any other. `hello` is what the client says it is (a rank):
covered by its tag, so nobody else can claim it. A frame is
    MAGIC, seq (8 bytes), length (8 bytes), tag = H(session, direction, seq, length, body[:macced]), body
where the receiver knows the next seq, refuses a length over its own cap before allocating anything,
and compares tags in constant time. `macced` lets a bulk body (KV bytes) go unhashed on the critical
path while its header stays bound: the connection itself is authenticated."""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import InvalidRequestError, RidgelineError

SECRET_ENV = "RIDGELINE_INTERNAL_SECRET"  # hex: how a launcher hands its children the secret
MIN_SECRET_BYTES = 16
MAGIC = b"RLA1"
NONCE = 16
TAG = 32
_FRAME = struct.Struct("<4sQQ32s")  # magic, seq, body length, tag
MAX_HELLO = 256


class AuthError(RidgelineError):
    """A peer on an internal channel failed authentication or sent a frame that is not bound to it."""


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def read_secret_file(path: str | os.PathLike) -> bytes:
    """The secret in `path` (its bytes, surrounding whitespace dropped; at least 16). Refused when other
    users may read or write it, as ssh refuses a private key."""
    p = Path(path)
    try:
        st = p.stat()
        data = p.read_bytes().strip()
    except OSError as e:
        raise InvalidRequestError(f"cannot read the internal secret file {str(p)!r}: {e.strerror}",
                                  "internal_secret_file") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidRequestError(f"the internal secret file {str(p)!r} is readable or writable by other users "
                                  f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it", "internal_secret_file")
    if len(data) < MIN_SECRET_BYTES:
        raise InvalidRequestError(f"the internal secret file {str(p)!r} holds {len(data)} bytes; it needs at least "
                                  f"{MIN_SECRET_BYTES} (e.g. `head -c 32 /dev/urandom | xxd -p > FILE`)",
                                  "internal_secret_file")
    return data


def take_secret_from_env() -> bytes | None:
    """The secret a launcher put in SECRET_ENV (removed from this process's environment, so nothing
    this process starts inherits it unasked); None when absent."""
    raw = os.environ.pop(SECRET_ENV, None)
    if raw is None:
        return None
    try:
        secret = bytes.fromhex(raw)
    except ValueError:
        raise InvalidRequestError(f"${SECRET_ENV} must be hex") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise InvalidRequestError(f"${SECRET_ENV} holds {len(secret)} bytes; it needs at least {MIN_SECRET_BYTES}")
    return secret


_DEPLOYMENT: tuple[bytes, bool] | None = None  # (the secret, whether it came from outside this process)


def deployment_secret(path: str | os.PathLike | None = None, required: bool = False) -> bytes:
    """This process's deployment secret, the same on every later call: what its launcher handed it
    ($RIDGELINE_INTERNAL_SECRET), else the file at `path` (--internal-secret-file), else (unless
    required: then an error) a new one that only this process and the children it hands it to hold."""
    global _DEPLOYMENT
    given = take_secret_from_env()  # a launcher's word wins, whenever it comes
    if given is None and path and (_DEPLOYMENT is None or not _DEPLOYMENT[1]):
        given = read_secret_file(path)
    if given is not None:
        _DEPLOYMENT = (given, True)
    elif _DEPLOYMENT is None:
        _DEPLOYMENT = (new_secret(), False)
    if required and not _DEPLOYMENT[1]:
        raise InvalidRequestError(
            "this launch needs the same internal secret in every process: --internal-secret-file FILE (mode 600; "
            "e.g. `head -c 32 /dev/urandom | xxd -p > FILE`, copied to every node) or "
            f"${SECRET_ENV} (hex)", "internal_secret_file")
    return _DEPLOYMENT[0]


def adopt_deployment_secret(secret: bytes) -> None:
    """What a launcher handed this process by other means (a replica's spec): its deployment secret."""
    global _DEPLOYMENT
    _DEPLOYMENT = (secret, True)


def env_with_secret(secret: bytes, env: dict[str, str] | None = None) -> dict[str, str]:
    """A child's environment carrying the secret (never its command line: any local user can read that)."""
    return {**(os.environ if env is None else env), SECRET_ENV: secret.hex()}


def _h(key: bytes, *parts: bytes) -> bytes:
    m = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        m.update(struct.pack("<I", len(part)))
        m.update(part)
    return m.digest()


@dataclass
class Session:
    """One authenticated connection: its key, which side this is, and the next sequence numbers."""
    sock: socket.socket
    key: bytes
    server: bool
    hello: bytes  # what the client said it is (covered by its tag)
    sent: int = 0
    received: int = 0

    def send(self, body: bytes | memoryview, macced: int | None = None, extra: bytes | memoryview = b"") -> None:
        """One frame: body (tagged up to `macced` bytes, all by default), then `extra` (untagged bulk
        bytes, counted in the length)."""
        n = len(body) + len(extra)
        head = memoryview(body)[:len(body) if macced is None else macced]
        tag = _h(self.key, b"s" if self.server else b"c", struct.pack("<QQ", self.sent, n), head)
        self.sock.sendall(_FRAME.pack(MAGIC, self.sent, n, tag))
        self.sock.sendall(body)
        if len(extra):
            self.sock.sendall(extra)
        self.sent += 1

    def recv_header(self, max_bytes: int) -> tuple[int, bytes]:
        """(body length, tag) of the next frame; AuthError for a wrong magic or sequence number, or a
        length over max_bytes (nothing allocated for it)."""
        magic, seq, n, tag = _FRAME.unpack(read_exact(self.sock, _FRAME.size))
        if magic != MAGIC:
            raise AuthError("not a Ridgeline internal frame")
        if seq != self.received:
            raise AuthError(f"frame {seq} out of sequence (expected {self.received}): replayed or reordered")
        if n > max_bytes:
            raise AuthError(f"a frame of {n} bytes is over this channel's limit of {max_bytes}")
        return n, tag

    def check(self, n: int, tag: bytes, head: bytes | memoryview) -> None:
        """The tag of a frame of n bytes whose tagged part is `head`; then count the frame received."""
        want = _h(self.key, b"c" if self.server else b"s", struct.pack("<QQ", self.received, n), head)
        if not hmac.compare_digest(want, tag):
            raise AuthError("a frame's tag does not match: forged or corrupted")
        self.received += 1

    def recv(self, max_bytes: int) -> bytes:
        """The next frame's body, all of it tagged."""
        n, tag = self.recv_header(max_bytes)
        body = read_exact(self.sock, n)
        self.check(n, tag, body)
        return body


def accept(sock: socket.socket, secret: bytes, label: str, timeout: float) -> Session:
    """Server side of the handshake on a connection just accepted; AuthError if the peer fails it."""
    sock.settimeout(timeout)
    lab = label.encode()
    nonce_s = secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + struct.pack("<H", len(lab)) + lab + nonce_s)
    nonce_c = read_exact(sock, NONCE)
    (n,) = struct.unpack("<H", read_exact(sock, 2))
    if n > MAX_HELLO:
        raise AuthError(f"a hello of {n} bytes (at most {MAX_HELLO})")
    hello = read_exact(sock, n)
    tag_c = read_exact(sock, TAG)
    if not hmac.compare_digest(tag_c, _h(secret, b"client", lab, nonce_s, nonce_c, hello)):
        raise AuthError("the peer does not hold this deployment's internal secret")
    sock.sendall(_h(secret, b"server", lab, nonce_s, nonce_c, hello))
    sock.settimeout(None)
    return Session(sock, _h(secret, b"session", lab, nonce_s, nonce_c, hello), True, hello)


def connect(sock: socket.socket, secret: bytes, label: str, timeout: float, hello: bytes = b"") -> Session:
    """Client side of the handshake on a connected socket; AuthError if the server does not prove it
    holds the secret (or runs another channel)."""
    if len(hello) > MAX_HELLO:
        raise ValueError("hello too long")
    sock.settimeout(timeout)
    lab = label.encode()
    if read_exact(sock, 4) != MAGIC:
        raise AuthError("the server does not speak Ridgeline's internal protocol")
    (n,) = struct.unpack("<H", read_exact(sock, 2))
    if read_exact(sock, n) != lab:
        raise AuthError(f"the server is not a {label} endpoint")
    nonce_s = read_exact(sock, NONCE)
    nonce_c = secrets.token_bytes(NONCE)
    sock.sendall(nonce_c + struct.pack("<H", len(hello)) + hello + _h(secret, b"client", lab, nonce_s, nonce_c, hello))
    if not hmac.compare_digest(read_exact(sock, TAG), _h(secret, b"server", lab, nonce_s, nonce_c, hello)):
        raise AuthError("the server does not hold this deployment's internal secret")
    sock.settimeout(None)
    return Session(sock, _h(secret, b"session", lab, nonce_s, nonce_c, hello), False, hello)


def read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    read_into(sock, memoryview(buf))
    return bytes(buf)


def read_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the connection closed mid-frame")
        got += k
