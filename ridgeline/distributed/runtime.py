"""This process's place in a tensor- or pipeline-parallel engine: its rank (and shard or stage), rank 0's
plan channel, and on one machine the worker processes rank 0 started (GroupRuntime, shared); the
collectives of a tensor-parallel rank (TPRuntime: TPComm); the stage of a pipeline (PPRuntime). Built
by LLMEngine before any weight is read; sizes that cannot split fail here, before a process starts."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time

import torch
import torch.distributed as dist

from ridgeline.distributed.comm import TPComm
from ridgeline.distributed.follow import follow
from ridgeline.distributed.frames import all_gather
from ridgeline.distributed.group import RankContext, join, leave, master, pin, split_cores, torchrun_env, unpin
from ridgeline.distributed.launch import Workers, exit_soon
from ridgeline.distributed.plan_channel import PlanFollower, PlanLeader, dial, listen
from ridgeline.distributed.layout import layout_for
from ridgeline.distributed.agreement import check_agreement
from ridgeline.distributed.shard import Slicer, check_groups, local_arch
from ridgeline.distributed.stages import stage_layout
from ridgeline.engine.parallel_runtime import ParallelRuntime, register_runtime
from ridgeline.errors import InvalidRequestError, RankFailedError
from ridgeline.utils import internal_auth

FAILURE_WAIT_S = 2.0  # after a failed collective, how long to wait for the dead rank's exit to show


class GroupRuntime(ParallelRuntime):
    """The process group of one engine (`size` ranks; param names the size option in errors)."""
    param, what = "tensor_parallel_size", "tensor-parallel rank"

    def _join(self, config, size: int, device: torch.device, rank: RankContext | None, arch=None) -> None:
        self.workers: Workers | None = None
        self.unpin = None
        self.closed = False
        self.folder: str | None = None  # one machine, rank 0: the rendezvous folder
        self.pairs: dict[int, socket.socket] = {}  # one machine, rank 0: its ends of the plan socket pairs
        if rank is None:
            rank, secret = self._start(config, size)
        else:  # a rank this engine's rank 0 spawned: the secret came in its environment
            secret = internal_auth.take_secret_from_env()
            if secret is None:
                raise InvalidRequestError("a spawned rank without its launch's secret", "parallel")
        self.ctx = rank
        timeout = config.parallel.dist_timeout
        store = join(rank, timeout, device)
        check_agreement(config, arch, size)  # versions, model and options: the same on every rank
        self.channel = self._plan_channel(store, secret, timeout)

    def _plan_channel(self, store, secret: bytes, timeout: float):
        ctx = self.ctx
        if ctx.rank == 0:
            if self.pairs:
                return PlanLeader.over_pairs(self.pairs, secret, timeout)
            listener = listen(ctx.addr)
            store.set("ridgeline/plan_port", str(listener.getsockname()[1]))
            return PlanLeader.over_listener(listener, secret, ctx.size, timeout)
        if ctx.plan_fd is not None:
            return PlanFollower(socket.socket(fileno=ctx.plan_fd), secret, ctx.rank)
        port = int(store.get("ridgeline/plan_port"))  # waits for rank 0 to listen
        return PlanFollower(dial(ctx.addr, port, ctx.rank, timeout), secret, ctx.rank)

    def _start(self, config, size: int) -> tuple[RankContext, bytes]:
        """This process's place and the launch's secret: under torchrun, as its environment says (the
        secret from $RIDGELINE_INTERNAL_SECRET or --internal-secret-file); on one machine, rank 0,
        which starts the other ranks with a new secret."""
        pc = config.parallel
        env = torchrun_env()
        if env is not None:
            addr, port = master(pc)
            r, world = env
            if world != size:
                raise InvalidRequestError(f"WORLD_SIZE is {world} but {self.param} is {size}; start one "
                                          "process per rank (torchrun --nproc-per-node x --nnodes = the size)",
                                          self.param)
            return RankContext(r, size, addr, port), launch_secret(pc)
        if pc.pin_cores and size > len(os.sched_getaffinity(0)):
            raise InvalidRequestError(f"{self.param} {size} is larger than the {len(os.sched_getaffinity(0))} "
                                      "CPU cores this process may use (one rank per core at least)", self.param)
        cores = split_cores(size) if pc.pin_cores else [None] * size
        self.folder = tempfile.mkdtemp(prefix="ridgeline-ranks-")  # mode 0700
        store = os.path.join(self.folder, "rendezvous")
        ends = {r: socket.socketpair() for r in range(1, size)}
        ranks = [RankContext(r, size, "127.0.0.1", 0, cores[r], True, store, ends[r][1].fileno() if r else None)
                 for r in range(size)]
        secret = internal_auth.new_secret()
        try:
            self.workers = Workers(config, ranks[1:], secret, self.what)
        finally:
            for r, (mine, theirs) in ends.items():
                theirs.close()  # the worker holds its own copy
                self.pairs[r] = mine
        if cores[0]:
            self.unpin = pin(cores[0])
        return ranks[0], secret

    @property
    def rank(self) -> int:
        return self.ctx.rank

    def agree_min(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def gather(self, obj) -> list:
        return all_gather(obj)

    def lead(self, runner) -> None:
        """Rank 0: every call of the runner that runs the model is published first."""
        runner.leader = self.channel.send

    def probe(self, sizes: tuple[int, ...] = (1, 1 << 18), reps: int = 20) -> list[float]:
        """Rank 0: time an all-reduce of each size on every rank (the link, apart from the model)."""
        from ridgeline.distributed.comm import probe_link
        self.channel.send("probe", (sizes, reps))
        return probe_link(sizes, reps)

    def follow(self, runner, max_len: int) -> None:
        follow(runner, self.channel, max_len)

    def failure(self, error: BaseException) -> RankFailedError:
        """What a failed step on rank 0 is: a dead rank (named, once its exit shows) or a broken collective
        (a rank stuck past dist_timeout). Either way the group cannot step again: the process exits
        (status 3) shortly after its caller has failed the requests in flight."""
        exit_soon(FAILURE_WAIT_S + 1.0)
        deadline = time.monotonic() + FAILURE_WAIT_S
        while self.workers is not None and time.monotonic() < deadline:
            why = self.workers.dead()
            if why:
                return RankFailedError(f"{why}; this request cannot finish and the server is exiting")
            time.sleep(0.05)
        return RankFailedError(f"a {self.what.rpartition(' ')[0]} collective failed ({error}); the server is exiting")

    def on_failure(self, callback) -> None:
        if self.workers is not None:
            self.workers.on_failure(callback)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.rank == 0:
            if self.workers is not None:
                self.workers.closing = True
            try:
                self.channel.send("stop", ())
            except (RuntimeError, dist.DistError, OSError):
                pass
            if self.workers is not None:
                self.workers.close()
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        for sock in self.pairs.values():
            sock.close()
        leave()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        if self.unpin is not None:
            unpin(self.unpin)
            self.unpin = None


def launch_secret(pc) -> bytes:
    """A torchrun launch's secret: every rank reads the same one (its launcher's environment, or a file)."""
    return internal_auth.deployment_secret(pc.internal_secret_file, required=True)


@register_runtime("tensor")
class TPRuntime(GroupRuntime):
    def __init__(self, config, arch, device: torch.device, rank: RankContext | None = None):
        size = config.parallel.tensor_parallel_size
        shards = layout_for(arch, size)
        if config.model.quantization not in ("auto", "none", "gguf", "gguf-a8"):  # blocks are checked as they load
            check_groups(shards, arch.head_dim, config.model.quant_group_size or 32)
        self._join(config, size, device, rank, arch)
        self.shard = shards[self.ctx.rank]
        self.comm = TPComm(self.shard, arch.vocab_size, dist.group.WORLD)
        self.slicer = Slicer(self.shard, arch.head_dim)
        self.arch = local_arch(arch, self.shard)

    def info(self, model, kv, pool_bytes: int):
        """Every rank's shard, resident weight bytes and KV bytes (gathered: one collective at start-up)."""
        from ridgeline.distributed.memory import TPInfo, resident_weight_bytes
        return TPInfo(self.ctx.size, tuple(self.gather((self.shard, resident_weight_bytes(model), pool_bytes))),
                      tuple(self.workers.pids) if self.workers else ())


@register_runtime("pipeline")
class PPRuntime(GroupRuntime):
    """A pipeline stage: rank r holds stage r's layers (distributed/stages.py); rank 0 is the first stage."""
    param, what = "pipeline_parallel_size", "pipeline stage"

    def __init__(self, config, arch, device: torch.device, rank: RankContext | None = None):
        size = config.parallel.pipeline_parallel_size
        stages = stage_layout(arch.num_layers, size)  # more stages than layers: refused before any start
        self._join(config, size, device, rank, arch)
        self.stage = stages[self.ctx.rank]
        self.arch = arch

    def info(self, model, kv, pool_bytes: int):
        """Every stage's layers, resident weight bytes, KV bytes and the tokens its own KV budget holds
        (gathered: one collective at start-up), beside what the same budget holds in one process."""
        from ridgeline.distributed.memory import PPInfo, resident_weight_bytes
        spec = kv.spec
        mine = (self.stage, resident_weight_bytes(model), kv.num_blocks * spec.bytes_per_block,
                (kv.own_blocks - 1) * spec.block_size)
        whole = spec.bytes_per_block // spec.num_layers * self.stage.num_layers  # a block of every layer
        return PPInfo(self.ctx.size, tuple(self.gather(mine)), (kv.num_blocks - 1) * spec.block_size,
                      kv.kv_bytes // whole * spec.block_size, tuple(self.workers.pids) if self.workers else ())

    def attach(self, runner, config) -> None:
        """The runner sends its stage's hidden states on and receives the previous stage's."""
        from ridgeline.distributed.pipeline import PipelineStage
        arch = self.arch
        runner.pipeline = PipelineStage(self.stage, config.parallel.pipeline_microbatches, arch.hidden_size,
                                        arch.vocab_size)

    def probe(self, sizes: tuple[int, ...] = (1, 1 << 18), reps: int = 20) -> list[float]:
        """Stage 0: time a message of each size to stage 1 and back (the link, apart from the model)."""
        from ridgeline.distributed.pipeline import probe_p2p
        self.channel.send("probe_p2p", (sizes, reps))
        return probe_p2p(sizes, reps, 0)
