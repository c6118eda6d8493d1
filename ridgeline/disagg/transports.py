"""The connector registry's transports: tcp (bytes on the socket) and shm (a shared-memory segment
named after its transfer). Each is only what differs from KVConnector's framing."""
from __future__ import annotations

import socket
from multiprocessing import resource_tracker, shared_memory

import _posixshmem  # what SharedMemory.unlink calls, without its resource-tracker message

import numpy as np

from ridgeline.disagg.connector import CONNECTORS, KVConnector, Outgoing, ReceiveLimits, register_connector
from ridgeline.disagg.payload import Header
from ridgeline.disagg.wire import Refused, read_into_by, shm_name
from ridgeline.errors import InvalidRequestError


@register_connector("tcp")
class TcpConnector(KVConnector):
    def send_body(self, session, out: Outgoing, tail: bytes) -> None:
        session.send(tail, macced=len(tail), extra=memoryview(out.data))
        out.data = np.empty(0, np.uint8)

    def body_bytes(self, meta: dict) -> int:
        return meta["nbytes"]

    def receive_bytes(self, sock: socket.socket, meta: dict, fields: dict, deadline: float):
        data = np.empty(meta["nbytes"], np.uint8)  # sizes checked against the layout and the budget
        read_into_by(sock, memoryview(data), deadline)
        return data, None


@register_connector("shm")
class ShmConnector(KVConnector):
    """The segment is created by the sender and unlinked by the receiver after use (or by the sender
    when delivery fails). Neither process's resource tracker owns it: a segment handed over must
    outlive its creator. Its name is `rlkv-<transfer id>`: the receiver maps no other, and only for
    a transfer it issued, named in an authenticated header."""

    def prepare(self, header: Header, gather) -> Outgoing:
        seg = shared_memory.SharedMemory(name=shm_name(header.transfer_id), create=True, size=max(header.nbytes, 1))
        _untrack(seg)
        view = np.ndarray((header.nbytes,), np.uint8, seg.buf)
        try:
            gather(view)
        except BaseException:
            del view
            _unlink(seg)
            raise
        return Outgoing(header, view, seg)

    def frame_fields(self, out: Outgoing) -> dict:
        return {"shm": out.handle.name.lstrip("/")}

    def delivered(self, out: Outgoing) -> None:
        seg, out.handle = out.handle, None
        out.data = np.empty(0, np.uint8)
        seg.close()  # the receiver unlinks it

    def discard(self, out: Outgoing) -> None:
        seg, out.handle = out.handle, None
        out.data = np.empty(0, np.uint8)
        if seg is not None:
            _unlink(seg)

    def check_fields(self, raw: dict, meta: dict) -> dict:
        name = shm_name(meta["transfer_id"])
        if raw.get("shm") != name:
            raise Refused(f"shared-memory segment {str(raw.get('shm'))[:80]!r} is not this transfer's ({name})")
        return {"shm": name}

    def receive_bytes(self, sock: socket.socket, meta: dict, fields: dict, deadline: float):
        try:
            seg = shared_memory.SharedMemory(name=fields["shm"])
        except (OSError, ValueError) as e:
            raise Refused(f"cannot map the KV segment {fields['shm']}: {e}") from None
        _untrack(seg)
        if seg.size < meta["nbytes"]:
            _unlink(seg)
            raise Refused(f"the KV segment {fields['shm']} holds {seg.size} bytes, not {meta['nbytes']}")
        view = np.ndarray((meta["nbytes"],), np.uint8, seg.buf)
        return view, lambda: _unlink(seg)


def _untrack(seg: shared_memory.SharedMemory) -> None:
    try:
        resource_tracker.unregister(seg._name, "shared_memory")  # noqa: SLF001 (the tracker keys by it)
    except Exception:  # no tracker running in this process: nothing to undo
        pass


def _unlink(seg: shared_memory.SharedMemory) -> None:
    try:
        seg.close()
    except BufferError:  # a view is still alive somewhere; unlinking still frees the name
        pass
    try:  # not seg.unlink(): that would tell this process's resource tracker, which no longer tracks it
        _posixshmem.shm_unlink(seg._name)  # noqa: SLF001
    except FileNotFoundError:
        pass


def create_connector(name: str, timeout: float = 10.0, **kw) -> KVConnector:
    if name not in CONNECTORS:
        raise InvalidRequestError(f"kv connector must be one of {', '.join(CONNECTORS)}, got {name!r}",
                                  "kv_connector")
    return CONNECTORS[name](timeout=timeout, **kw)


__all__ = ["ReceiveLimits", "TcpConnector", "ShmConnector", "create_connector"]
