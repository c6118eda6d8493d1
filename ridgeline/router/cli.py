"""`ridgeline router --replica URL [--replica URL ...] --policy {round-robin,least-load,cache-aware}`."""
from __future__ import annotations

import argparse
import asyncio
import logging

from ridgeline.cli_parser import positive_float
from ridgeline.errors import InvalidRequestError, RidgelineError
from ridgeline.http.front_limits import add_front_args, front_limits, front_problems, resolve_api_key, warn_if_exposed


def register(subparsers, command: str | None = None) -> None:
    from ridgeline.router.policy import POLICIES
    p = subparsers.add_parser(
        "router", help="one OpenAI endpoint in front of Ridgeline replicas (round-robin, least-load, cache-aware)",
        description="Proxy the OpenAI routes to a set of `ridgeline serve` replicas of one model, picking a "
                    "replica per request. cache-aware follows the replicas' KV events (start them with "
                    "--kv-events-endpoint) and sends a request where its prompt's prefix is cached, unless "
                    "that replica is overloaded.")
    p.add_argument("--replica", action="append", default=[], metavar="URL",
                   help="a replica's base URL, e.g. http://10.0.0.2:8000 (repeat for each)")
    p.add_argument("--policy", default="cache-aware", choices=list(POLICIES), help="how a replica is picked")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one")
    p.add_argument("--tokenizer", default=None, metavar="FOLDER",
                   help="cache-aware: the model's tokenizer folder (default: the replicas' model folder, "
                        "when this machine has it)")
    p.add_argument("--health-interval", type=positive_float, default=2.0, metavar="S",
                   help="seconds between health checks of each replica")
    p.add_argument("--slack", type=float, default=0.5,
                   help="cache-aware: a replica above (1 + slack) x the mean load loses its cache affinity")
    g = p.add_argument_group("the router's own front (as `ridgeline serve` has them)")
    add_front_args(g)
    p.add_argument("--replica-api-key", default=None,
                   help="the key the router sends to the replicas on every call (default: the router's --api-key); "
                        "clients' Authorization headers are checked by the router and never passed on")
    p.add_argument("--internal-secret-file", default=None, metavar="FILE",
                   help="with --api-key-file: the deployment's secret, the same file the replicas read, so the "
                        "router derives each tenant's prefix-cache hashes as they do (mode 600; default: "
                        "$RIDGELINE_INTERNAL_SECRET, else none)")
    p.set_defaults(func=cmd_router)


def cmd_router(args: argparse.Namespace) -> int:
    from ridgeline.http.server import bind, url_of
    from ridgeline.router.core import RouterSettings
    from ridgeline.router.serve import build_router, serve_router

    bad = front_problems(args) + ([] if 0 <= args.port <= 65535 else ["--port must be in [0, 65535]"])
    if bad:
        raise InvalidRequestError("; ".join(bad))
    args.api_key = resolve_api_key(args.api_key)
    replica_key = args.api_key if args.replica_api_key is None else resolve_api_key(args.replica_api_key,
                                                                                   "--replica-api-key")
    if args.api_key_file is not None:
        if replica_key is None:
            raise InvalidRequestError("--api-key-file needs --replica-api-key: the key the replicas check, which "
                                      "they trust to name each request's tenant (start them with --api-key KEY "
                                      "--tenant-header)", "replica_api_key")
        from ridgeline.utils.internal_auth import deployment_secret
        deployment_secret(args.internal_secret_file)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per proxied request
    settings = RouterSettings(args.policy, args.health_interval, slack=args.slack, replica_api_key=replica_key,
                              limits=front_limits(args))
    warn_if_exposed(args.host, args.api_key or args.api_key_file, "the router")
    router = asyncio.run(build_router(args.replica, settings, args.tokenizer))
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        raise RidgelineError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from None
    sock.listen(2048)  # connections queue from now on: the line below may be read as "ready"
    print(f"routing   {len(router.replicas)} replica(s) of `{router.replicas[0].info.get('model')}` "
          f"({args.policy}) at {url_of(sock)}/v1", flush=True)
    return serve_router(router, sock)
