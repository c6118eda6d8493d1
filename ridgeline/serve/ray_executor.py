"""`--executor ray`: replicas as Ray actors on an existing cluster (`ray start --head`, then
`ray start --address HEAD:6379` on each other machine). Each actor asks Ray for its CPUs (placement
by resources: num_cpus), loads the model on whichever node Ray picks and serves the OpenAI routes on
that node's address (the one Ray uses for it; a port the OS picks) under a key made for this launch,
which only the router holds. Its KV events go to an ipc:// socket on its node, which only a router on
the same machine can follow; `--ray-kv-events tcp` publishes them on the node's address instead (ZeroMQ
without authentication: block hashes, readable by anyone who reaches the port).

Ray itself moves actors' arguments and results with cloudpickle and does not authenticate its
peers: the cluster's ports must be on a private network, whatever Ridgeline does.

Every node needs Ridgeline installed (the same version), or the same checkout at the same path
(actors get the driver's package folder on PYTHONPATH) and the model at the same path or alias."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import RidgelineError
from ridgeline.router.launch import START_TIMEOUT_S


class ReplicaActor:
    """Runs on a Ray worker: one replica's server on a background thread."""

    def __init__(self, spec: dict, kv_events: str | None):
        import ray

        from ridgeline.serve.replica_main import build_replica_app
        from ridgeline.serve.server import ServerThread
        host = ray.util.get_node_ip_address()
        self.node = ray.get_runtime_context().get_node_id()
        self.folder = tempfile.mkdtemp(prefix="ridgeline-ray-")  # mode 0700: the ipc socket is this user's
        endpoint = {"tcp": f"tcp://{host}:*", "ipc": f"ipc://{self.folder}/kv", None: None}[kv_events]
        spec = {**spec, "settings": {**spec["settings"], "kv_events_endpoint": endpoint}}
        self.server = ServerThread(build_replica_app(spec), host=host, port=0).start(timeout=START_TIMEOUT_S)

    def where(self) -> tuple[str, str]:
        """(its URL, its Ray node id)"""
        return self.server.url, self.node

    def stop(self) -> None:
        self.server.stop(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class RayReplica:
    index: int
    url: str
    actor: object


class RayLauncher:
    def __init__(self, address: str = "auto", cpus_per_replica: int | None = None, kv_transport: str = "ipc"):
        try:
            import ray
        except ImportError:
            raise RidgelineError("--executor ray needs Ray: pip install 'ridgeline[ray]'") from None
        self.ray = ray
        self.address = address
        self.cpus_per_replica = cpus_per_replica
        self.kv_transport = kv_transport  # "ipc": only replicas on this node can be followed; "tcp": any
        self.replicas: list[RayReplica] = []

    def _reachable(self) -> None:
        """ray.init retries a dead address for a long time: a refused connection is an error now."""
        host, _, port = self.address.removeprefix("ray://").rpartition(":")
        if self.address == "auto" or not port.isdigit():
            return
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        except OSError as e:
            raise RidgelineError(f"--executor ray: no Ray cluster at {self.address} ({e.strerror or e}); start "
                                 "one with `ray start --head` (and `ray start --address HEAD:6379` on other "
                                 "machines)") from None

    def _connect(self) -> None:
        self._reachable()
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        self.env = {"PYTHONPATH": path}
        try:
            self.ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False,
                          runtime_env={"env_vars": self.env})
        except Exception as e:  # ConnectionError, or a timeout while looking for the cluster
            raise RidgelineError(f"--executor ray: no Ray cluster at {self.address} ({e}); start one with "
                                 "`ray start --head` (and `ray start --address HEAD:6379` on other machines)") from None

    def start(self, specs: list[dict], kv_events: bool = True) -> list[RayReplica]:
        self._connect()
        cpus = self.cpus_per_replica or max(1, int(self.ray.cluster_resources().get("CPU", 1)) // len(specs))
        remote = self.ray.remote(ReplicaActor)
        actors = []
        for i, spec in enumerate(specs):
            spec = {**spec, "index": i, "threads": cpus, "cpus": None}
            env = {**self.env, "OMP_NUM_THREADS": str(cpus)}
            actors.append(remote.options(num_cpus=cpus, runtime_env={"env_vars": env}).remote(
                spec, self.kv_transport if kv_events else None))
        try:
            places = self.ray.get([a.where.remote() for a in actors], timeout=START_TIMEOUT_S)
        except Exception as e:  # RayActorError, GetTimeoutError: the cause is in the actor's log
            for a in actors:
                self.ray.kill(a)
            raise RidgelineError(f"--executor ray: a replica failed to start: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
        self.replicas = [RayReplica(i, url, a) for i, ((url, _), a) in enumerate(zip(places, actors))]
        if kv_events:
            self._check_followable([node for _, node in places])
        return self.replicas

    def _check_followable(self, nodes: list[str]) -> None:
        """ipc:// KV events can only be followed from the replica's own machine: never route blind."""
        here = self.ray.get_runtime_context().get_node_id()
        away = [i for i, node in enumerate(nodes) if node != here]
        if self.kv_transport == "ipc" and away:
            self.stop()
            raise RidgelineError(f"--executor ray: replica(s) {away} run on another machine, and cache-aware routing "
                                 "follows each replica's KV events, published on ipc:// on its own machine: give "
                                 "--ray-kv-events tcp (unauthenticated, on the nodes' addresses: a private network "
                                 "only) or --router-policy least-load")

    def exit_reason(self, url: str) -> str | None:
        return None  # a dead actor's server stops answering: the health checks take it out

    def stop(self, timeout: float = 30.0) -> None:
        if self.replicas:
            try:
                self.ray.get([r.actor.stop.remote() for r in self.replicas], timeout=timeout)
            except Exception:
                pass
            for r in self.replicas:
                self.ray.kill(r.actor)
        self.replicas = []
        if self.ray.is_initialized():
            self.ray.shutdown()
