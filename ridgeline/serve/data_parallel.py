"""`ridgeline serve --data-parallel-size N`: N replicas of the model (processes on this machine, or
Ray actors with --executor ray) behind one OpenAI endpoint, the router in this process.

The public socket is bound first (a busy port fails in a second). Replicas listen on internal
addresses nobody configures (loopback ports the OS picks, KV events on ipc:// sockets), so two such
servers on one host never collide, and each needs a key made for this launch, which only the router
holds: clients reach the replicas through the router's guard (--api-key and the limits) only. A
replica that exits is out of rotation at once; with all of them out, requests get 503."""
from __future__ import annotations

import argparse
import asyncio

from ridgeline.errors import RidgelineError
from ridgeline.http.front_limits import new_api_key
from ridgeline.router.core import RouterSettings
from ridgeline.router.data_parallel import replica_spec
from ridgeline.utils.internal_auth import deployment_secret


def serve_data_parallel(args: argparse.Namespace, model: str, engine: dict, settings, sock) -> int:
    from ridgeline.http.server import url_of
    from ridgeline.router.serve import build_router, serve_router

    n = args.data_parallel_size
    caching = engine["enable_prefix_caching"] and engine["kv_eviction"] == "none"
    if args.router_policy == "cache-aware" and not caching:
        raise RidgelineError("--router-policy cache-aware follows the replicas' prefix caches, which are off here "
                             "(--no-prefix-caching or --kv-eviction); use --router-policy least-load")
    replica_key = new_api_key()
    spec = replica_spec(model, engine, settings, replica_key, deployment_secret(args.internal_secret_file))
    if args.executor == "ray":
        from ridgeline.serve.ray_executor import RayLauncher
        launcher = RayLauncher(args.ray_address, args.ray_cpus_per_replica, args.ray_kv_events)
    else:
        from ridgeline.router.launch import ProcessLauncher
        launcher = ProcessLauncher()
    try:
        replicas = launcher.start([spec] * n, kv_events=args.router_policy == "cache-aware")  # what is followed
        policy = RouterSettings(args.router_policy, replica_api_key=replica_key, quiet=settings.quiet,
                                limits=settings.limits)
        router = asyncio.run(build_router([r.url for r in replicas], policy))
        router.exit_reason = launcher.exit_reason
        sock.listen(2048)  # connections queue from now on: the line below may be read as "ready"
        print(f"serving   `{settings.served_model_name}` at {url_of(sock)}/v1: {n} replicas "
              f"({args.executor}), {args.router_policy} routing; Ctrl-C stops", flush=True)
        return serve_router(router, sock)
    except RidgelineError:
        raise
    finally:
        launcher.stop()
