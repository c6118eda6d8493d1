"""The connector registry's transports: tcp (bytes on the socket) and shm (a shared-memory segment
named on the socket). Each is only what differs from KVConnector's framing."""
from __future__ import annotations

import socket
import uuid
from multiprocessing import resource_tracker, shared_memory

import _posixshmem  # what SharedMemory.unlink calls, without its resource-tracker message

import numpy as np

from ridgeline.disagg.connector import CONNECTORS, KVConnector, Outgoing, TransferError, _read_into, register_connector
from ridgeline.disagg.payload import Header, KVPayload
from ridgeline.errors import InvalidRequestError


@register_connector("tcp")
class TcpConnector(KVConnector):
    def send_body(self, sock: socket.socket, out: Outgoing) -> None:
        sock.sendall(memoryview(out.data))
        out.data = np.empty(0, np.uint8)

    def receive_payload(self, sock: socket.socket, header: Header, meta: dict) -> KVPayload:
        data = np.empty(header.nbytes, np.uint8)
        _read_into(sock, memoryview(data))
        return KVPayload(header, data)


@register_connector("shm")
class ShmConnector(KVConnector):
    """The segment is created by the sender and unlinked by the receiver after use (or by the sender
    when delivery fails). Neither process's resource tracker owns it: a segment handed over must
    outlive its creator."""

    def prepare(self, header: Header, gather) -> Outgoing:
        seg = shared_memory.SharedMemory(name=f"rlkv-{uuid.uuid4().hex[:20]}", create=True,
                                         size=max(header.nbytes, 1))
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
        return {"shm": out.handle.name}

    def delivered(self, out: Outgoing) -> None:
        seg, out.handle = out.handle, None
        out.data = np.empty(0, np.uint8)
        seg.close()  # the receiver unlinks it

    def discard(self, out: Outgoing) -> None:
        seg, out.handle = out.handle, None
        out.data = np.empty(0, np.uint8)
        if seg is not None:
            _unlink(seg)

    def receive_payload(self, sock: socket.socket, header: Header, meta: dict) -> KVPayload:
        try:
            seg = shared_memory.SharedMemory(name=str(meta["shm"]))
        except (OSError, ValueError) as e:
            raise TransferError(f"cannot map the KV segment {meta.get('shm')!r}: {e}") from e
        _untrack(seg)
        if seg.size < header.nbytes:
            _unlink(seg)
            raise TransferError("the KV segment is smaller than its header says")
        view = np.ndarray((header.nbytes,), np.uint8, seg.buf)
        return KVPayload(header, view, lambda: _unlink(seg))


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
