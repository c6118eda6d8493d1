"""wire.py frames over torch.distributed's tensor collectives, in place of the `*_object` collectives
(which unpickle what a peer sends): a frame's length goes first in an int64 tensor and is checked
against MAX_FRAME before its bytes are received into a uint8 tensor. On NCCL the tensors live on
this rank's GPU, as those collectives require."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ridgeline.distributed import wire, wire_types  # noqa: F401  (registers what ranks send)

MAX_FRAME = 64 << 20  # start-up facts and a step's sampled tokens are far smaller


def _device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _checked(n: int) -> int:
    if not 0 <= n <= MAX_FRAME:
        raise wire.WireError(f"a peer announced a frame of {n} bytes (at most {MAX_FRAME})")
    return n


def _bytes(t: torch.Tensor, n: int) -> bytes:
    return t[:n].cpu().numpy().tobytes()


def all_gather(obj, group=None) -> list:
    """Every rank's obj, in rank order (a collective: every rank calls it)."""
    dev, data = _device(group), wire.encode(obj)
    size = dist.get_world_size(group)
    n = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    lens = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(size)]
    dist.all_gather(lens, n, group=group)
    lens = [_checked(int(x.item())) for x in lens]
    buf = torch.zeros(max(lens), dtype=torch.uint8, device=dev)
    buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)  # never empty: a length leads
    outs = [torch.empty_like(buf) for _ in range(size)]
    dist.all_gather(outs, buf, group=group)
    return [wire.decode(_bytes(o, k)) for o, k in zip(outs, lens)]


def send(obj, dst: int, group=None) -> None:
    dev, data = _device(group), wire.encode(obj)
    dist.send(torch.tensor([len(data)], dtype=torch.int64, device=dev), dst, group=group)
    dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev), dst, group=group)


def recv(src: int, group=None):
    dev = _device(group)
    n = torch.zeros(1, dtype=torch.int64, device=dev)
    dist.recv(n, src, group=group)
    buf = torch.empty(_checked(int(n.item())), dtype=torch.uint8, device=dev)
    dist.recv(buf, src, group=group)
    return wire.decode(_bytes(buf, buf.numel()))
