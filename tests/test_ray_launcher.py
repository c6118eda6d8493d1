"""`--executor ray` without a cluster: RayLauncher and ReplicaActor against a stand-in `ray` module.
A replica serves under the launch's key on its node's address; its KV events are on ipc:// unless
asked for tcp; a cache-aware router that could not follow a replica on another node is an error.
(tests/test_ray_executor.py runs the real thing where Ray is installed.)"""
from __future__ import annotations

import os
import sys
import types

import httpx
import pytest

from ridgeline.errors import RidgelineError
from ridgeline.http.front_limits import auth_headers
from ridgeline.router.data_parallel import replica_spec
from ridgeline.serve.state import ServerSettings

pytest.importorskip("zmq", reason="pyzmq is not installed (pip install 'ridgeline[router]')")
HERE = "node-here"


class _Ref:
    def __init__(self, value):
        self.value = value


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return _Ref(self.fn(*args))


class _Handle:
    """An actor handle: its methods called through `.remote()`, run at once."""

    def __init__(self, actor):
        self.actor = actor

    def __getattr__(self, name):
        return _Method(getattr(self.actor, name))


class _Remote:
    def __init__(self, ray, cls):
        self.ray, self.cls = ray, cls

    def options(self, **_):
        return self

    def remote(self, *args):
        self.ray.started.append(args)
        return _Handle(self.ray.make(*args))


def fake_ray(make) -> types.ModuleType:
    """A `ray` whose actors are built at once by `make(spec, kv_events)`, the driver on node HERE."""
    ray = types.ModuleType("ray")
    ray.started, ray.make = [], make
    ray.init = lambda **_: None
    ray.is_initialized = lambda: True
    ray.shutdown = lambda: None
    ray.kill = lambda _: None
    ray.cluster_resources = lambda: {"CPU": 2}
    ray.remote = lambda cls: _Remote(ray, cls)
    ray.get = lambda refs, timeout=None: [r.value for r in refs] if isinstance(refs, list) else refs.value
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_node_id=lambda: HERE)
    ray.util = types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")
    return ray


class _Stub:
    def __init__(self, url, node):
        self.url, self.node, self.stopped = url, node, False

    def where(self):
        return self.url, self.node

    def stop(self):
        self.stopped = True


def _launcher(monkeypatch, nodes, kv_transport):
    from ridgeline.serve.ray_executor import RayLauncher
    stubs = iter(_Stub(f"http://10.0.0.{i}:8000", n) for i, n in enumerate(nodes))
    ray = fake_ray(lambda spec, kv: next(stubs))
    monkeypatch.setitem(sys.modules, "ray", ray)
    return RayLauncher("auto", 1, kv_transport), ray


def test_replicas_on_other_nodes_need_tcp_kv_events_for_cache_aware_routing(monkeypatch):
    spec = {"model": "m", "engine": {}, "settings": {"api_key": "launch-key"}}
    launcher, ray = _launcher(monkeypatch, [HERE, "node-there"], "ipc")
    with pytest.raises(RidgelineError, match="replica\\(s\\) \\[1\\] run on another machine.*--ray-kv-events tcp"):
        launcher.start([spec, spec], kv_events=True)
    assert [kv for _, kv in ray.started] == ["ipc", "ipc"]
    launcher, ray = _launcher(monkeypatch, [HERE, "node-there"], "tcp")
    assert [r.url for r in launcher.start([spec, spec], kv_events=True)] == ["http://10.0.0.0:8000",
                                                                             "http://10.0.0.1:8000"]
    assert [kv for _, kv in ray.started] == ["tcp", "tcp"]
    launcher, ray = _launcher(monkeypatch, [HERE, "node-there"], "ipc")
    launcher.start([spec, spec], kv_events=False)  # least-load follows no events: nothing to check
    assert [kv for _, kv in ray.started] == [None, None]
    assert all(s["settings"]["api_key"] == "launch-key" for s, _ in ray.started)


@pytest.mark.parametrize("kv, scheme", [("ipc", "ipc://"), ("tcp", "tcp://127.0.0.1:")])
def test_a_replica_actor_serves_under_the_launch_key_with_its_events_where_asked(kv, scheme, monkeypatch,
                                                                                 tiny_llama):
    from ridgeline.serve.ray_executor import ReplicaActor
    monkeypatch.setitem(sys.modules, "ray", fake_ray(None))
    settings = ServerSettings("tiny", api_key="the-users-key", kv_events_endpoint="tcp://*:5557")
    spec = {**replica_spec(str(tiny_llama), {"dtype": "float32", "kv_cache_memory": "2MiB"}, settings, "launch-key", b"s" * 32),
            "threads": 1}
    actor = ReplicaActor(spec, kv)
    try:
        url, node = actor.where()
        assert url.startswith("http://127.0.0.1:") and node == HERE  # the node's address, not 0.0.0.0
        assert httpx.get(url + "/info", headers=auth_headers("the-users-key")).status_code == 401
        info = httpx.get(url + "/info", headers=auth_headers("launch-key")).json()
        assert info["kv_events_endpoint"].startswith(scheme)  # not the user's tcp://*:5557
        folder = actor.folder
        assert os.stat(folder).st_mode & 0o077 == 0
    finally:
        actor.stop()
    assert not os.path.exists(folder)
