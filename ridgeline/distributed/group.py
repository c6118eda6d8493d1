"""Who this process is in a tensor-parallel group and how it joins it: rank and size from the engine
(ranks it spawned) or from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK); gloo on CPU, NCCL on
CUDA.

On one machine (the engine spawned its ranks) the rendezvous is a FileStore in a folder only this
user can read, and gloo / NCCL bind loopback: the group opens no port outside 127.0.0.1. Under
torchrun the rendezvous is torchrun's store (or, without its agent, a TCPStore rank 0 hosts on the
master address given, never the wildcard): that store and the collectives' own connections trust
whoever reaches them, so such a launch belongs on a private network (the plan channel is
authenticated either way: plan_channel.py). The master address and port come from the
configuration, else MASTER_ADDR / MASTER_PORT, else 127.0.0.1 and a free port."""
from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ridgeline.errors import InvalidRequestError
from ridgeline.utils.net import bind_tcp

LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}  # one machine: collectives on loopback


@dataclass(frozen=True)
class RankContext:
    rank: int
    size: int
    addr: str  # torchrun: the store's (and rank 0's plan listener's) address
    port: int  # torchrun: the store's port
    cores: tuple[int, ...] | None = None  # CPU cores this rank is pinned to (one-machine launch); None: as is
    spawned: bool = False  # rank 0 spawned the others (one machine); else torchrun started every rank
    store_path: str | None = None  # one machine: the rendezvous FileStore, in a folder only this user reads
    plan_fd: int | None = None  # one machine, a follower: its end of rank 0's plan socket pair


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world size) when started by torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise InvalidRequestError("RANK and WORLD_SIZE must be integers") from None


def master(pc) -> tuple[str, int]:
    """(address, port) of rank 0's store: flags, then MASTER_ADDR / MASTER_PORT, then 127.0.0.1 and a free port."""
    addr = pc.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = pc.master_port or (int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None)
    return addr, port if port else free_port(addr)


def split_cores(size: int) -> list[tuple[int, ...]]:
    """This machine's usable cores in `size` contiguous shares (ranks share cores when there are fewer)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < size:
        return [(cores[r % len(cores)],) for r in range(size)]
    step = len(cores) // size
    return [tuple(cores[r * step:(r + 1) * step]) for r in range(size)]


def pin(cores: tuple[int, ...]) -> tuple[set[int], int]:
    """Pin every thread of this process to `cores`, with as many torch threads; returns what it replaced."""
    before = (os.sched_getaffinity(0), torch.get_num_threads())
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that just ended
            pass
    torch.set_num_threads(len(cores))
    return before


def unpin(before: tuple[set[int], int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), before[0])
        except OSError:
            pass
    torch.set_num_threads(before[1])


def join(ctx: RankContext, timeout_s: float, device: torch.device) -> dist.Store:
    """Join the default process group; returns the rendezvous store (torchrun: where rank 0 names its
    plan listener's port)."""
    if ctx.store_path is not None:
        store = dist.FileStore(ctx.store_path, ctx.size)
    else:
        store = _tcp_store(ctx, timeout_s)
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        with _env(LOOPBACK_ENV if ctx.store_path is not None else {}):
            dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=ctx.rank,
                                    world_size=ctx.size, timeout=timedelta(seconds=timeout_s))
    except (RuntimeError, dist.DistError) as e:
        raise InvalidRequestError(f"rank {ctx.rank}: the {ctx.size} ranks did not all join within "
                                  f"{timeout_s:g} s ({e}); is the world size larger than the processes "
                                  "started?") from None
    return store


def _tcp_store(ctx: RankContext, timeout_s: float) -> dist.Store:
    """torchrun's agent store (a client of it), or one rank 0 hosts on a socket bound to the master address."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    timeout = timedelta(seconds=timeout_s)
    try:
        if ctx.rank == 0 and not agent:
            fd = bind_tcp(ctx.addr, ctx.port, 512).detach()  # the store serves on it from now on, and owns it
            return dist.TCPStore(ctx.addr, ctx.port, ctx.size, True, timeout=timeout, master_listen_fd=fd)
        return dist.TCPStore(ctx.addr, ctx.port, ctx.size, False, timeout=timeout)
    except (RuntimeError, OSError) as e:
        raise InvalidRequestError(f"rank {ctx.rank}: the rendezvous at {ctx.addr}:{ctx.port} did not gather all "
                                  f"{ctx.size} ranks within {timeout_s:g} s ({e}); check --master-addr / --master-port "
                                  f"and that all {ctx.size} ranks were started") from None


@contextlib.contextmanager
def _env(values: dict[str, str]):
    """os.environ with `values` set, restored after (gloo and NCCL read their interface at group creation)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
