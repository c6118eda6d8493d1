"""The parallel runtime's seam: how the engine runs over several processes without naming the package
that implements it (distributed/).

A runtime is this process's part of one engine spread over ranks: tensor parallelism (each rank a slice
of every layer), pipeline parallelism (each rank a range of layers) or expert parallelism (each rank a
block of every sparse layer's experts). The engine asks the registry for the runtime its options name,
builds the model and the KV pool through it (`comm`, `slicer`, `arch`, `stage`, `experts`), lets rank 0
publish the runner's calls (`lead`) while the others replay them (`follow`), and closes it once.

Implementations register with `register_runtime(kind)`; the built-in ones are imported on first use
from the modules named in _BUILTIN (as the proposer registry does), so `import ridgeline.engine` loads
no distributed code."""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod

KINDS = ("tensor", "pipeline", "expert")
_BUILTIN = {"tensor": "ridgeline.distributed.runtime", "pipeline": "ridgeline.distributed.runtime",
            "expert": "ridgeline.distributed.ep_runtime", "expert-sharding": "ridgeline.distributed.expert_group"}
_RUNTIMES: dict[str, object] = {}


class ParallelRuntime(ABC):
    """This process's rank of a parallel engine. Attributes the builders read (None where the kind has
    none): `comm` (the tensor-parallel layers' communicator), `slicer` (which slice of each checkpoint
    tensor this rank loads), `arch` (this rank's ArchConfig: its heads and widths), `stage` (a pipeline
    stage's layer range), `closed`."""
    comm = slicer = stage = None
    closed = False

    @property
    @abstractmethod
    def rank(self) -> int: ...

    @abstractmethod
    def agree_min(self, n: int) -> int:
        """The smallest n over the ranks (every rank calls it: the KV block count they all can hold)."""

    @abstractmethod
    def lead(self, runner) -> None:
        """Rank 0: every call of the runner that runs the model is published to the others first."""

    @abstractmethod
    def follow(self, runner, max_len: int) -> None:
        """A follower: run rank 0's calls until it stops the group."""

    @abstractmethod
    def info(self, model, kv, pool_bytes: int):
        """What start-up reports of the ranks (their shards or stages, weight and KV bytes); one collective."""

    def attach(self, runner, config) -> None:
        """Fit the runner to this rank's part (a pipeline stage's sends and receives); nothing by default."""

    @abstractmethod
    def failure(self, error: BaseException) -> Exception:
        """The error a failed step on rank 0 is reported as (a dead rank named where it shows)."""

    @abstractmethod
    def on_failure(self, callback) -> None:
        """callback(message) when another rank dies."""

    @abstractmethod
    def close(self) -> None:
        """Stop the other ranks, give back the CPU pin, leave the group. Idempotent."""


def register_runtime(kind: str):
    """Class decorator: the runtime for `kind` ("tensor", "pipeline", "expert"; "expert-sharding": the
    function that gives sparse layers their ExpertSharding, layers/expert_sharding.py)."""
    def deco(obj):
        _RUNTIMES[kind] = obj
        return obj
    return deco


def runtime(kind: str):
    """The registered runtime (class or function) for kind, loading the built-in one on first use."""
    if kind not in _RUNTIMES and kind in _BUILTIN:
        importlib.import_module(_BUILTIN[kind])  # registers it
    if kind not in _RUNTIMES:
        raise KeyError(f"no parallel runtime registered for {kind!r}")
    return _RUNTIMES[kind]
