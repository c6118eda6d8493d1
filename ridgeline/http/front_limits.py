"""What every HTTP front Ridgeline runs (the OpenAI server, the router, the disaggregated front)
enforces, the flags that set it, and how an API key is read and handed to child processes.

- `FrontLimits`: the Guard's and the HTTP protocol's settings (guard.py, transport.py).
- `add_front_args` / `front_limits`: the same flags with the same defaults on every front's command.
- The key: `--api-key`, else $RIDGELINE_API_KEY; an empty one is an error, never "auth off". Read
  once and removed from this process's environment, so nothing it starts inherits it unasked; a
  launcher hands a child its key by environment (`env_with_api_key`), never on its command line,
  which any local user can read (/proc/PID/cmdline).
- `exposure_warning`: listening beyond loopback without a key is allowed, and said."""
from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import sys
from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError
from ridgeline.utils.api_key_env import API_KEY_ENV



@dataclass(frozen=True)
class FrontLimits:
    api_key: str | None = None  # every route but /health needs `Authorization: Bearer KEY`
    public_metrics: bool = False  # with a key: /metrics needs none
    max_body_bytes: int = 8 << 20  # larger request bodies get 413
    timeout_header: float = 10.0  # seconds a connection gets to send a request's headers
    timeout_body: float = 60.0  # seconds a request gets to send its whole body, once its headers are in
    max_connections: int = 1000  # open connections; a request on one over the cap gets 503
    api_key_file: str | None = None  # several keys, each with its tenant (api_keys.py); not with api_key
    allowed_origins: tuple[str, ...] = ()  # web pages (besides this front's own) that may send requests
    # a launcher's internal key: requests that carry it name their tenant in x-ridgeline-tenant (the
    # front in front of this process authenticated the client); never set for a key a client holds
    tenant_header: bool = False


_D = FrontLimits()


def add_front_args(g) -> None:
    """The flags of FrontLimits, on an argparse group (or parser)."""
    g.add_argument("--api-key", default=None,
                   help=f"require `Authorization: Bearer KEY` on every route but /health "
                        f"(default: ${API_KEY_ENV}, else no key; an empty key is an error)")
    g.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="several keys, one `KEY TENANT` per line (mode 600): each tenant reuses only its own "
                        "prefix-cache blocks (default: none; not with --api-key)")
    g.add_argument("--allowed-origins", default="", metavar="ORIGINS",
                   help="comma-separated web origins (e.g. https://app.example.com, or *) whose pages may call "
                        "this API, with CORS headers; other pages are refused with 403 (default: none but the "
                        "console this front serves)")
    g.add_argument("--public-metrics", action="store_true",
                   help="with --api-key: /metrics needs no key (default: it needs the key)")
    g.add_argument("--max-body-bytes", type=int, default=_D.max_body_bytes,
                   help="larger request bodies get 413 (default: %(default)s)")
    g.add_argument("--timeout-header", type=float, default=_D.timeout_header,
                   help="seconds a connection gets to send a request's headers before it is closed "
                        "(default: %(default)s)")
    g.add_argument("--timeout-body", type=float, default=_D.timeout_body,
                   help="seconds a request gets to send its whole body after its headers (then 408) "
                        "(default: %(default)s)")
    g.add_argument("--max-connections", type=int, default=_D.max_connections,
                   help="open connections; a request on one over the cap gets 503 (default: %(default)s)")


def front_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the FrontLimits flags of args, one phrase each."""
    bad = [f"--{name.replace('_', '-')} must be {rule}" for name, ok, rule in (
        ("max_body_bytes", args.max_body_bytes >= 1, ">= 1"), ("timeout_header", args.timeout_header > 0, "> 0"),
        ("timeout_body", args.timeout_body > 0, "> 0"), ("max_connections", args.max_connections >= 1, ">= 1"))
        if not ok]
    if args.api_key_file is not None and args.api_key is not None:
        bad.append("give --api-key or --api-key-file, not both")
    for origin in allowed_origins(args):
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            bad.append(f"--allowed-origins: {origin!r} is not an origin (scheme://host[:port], or *)")
    return bad


def allowed_origins(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())


def front_limits(args: argparse.Namespace) -> FrontLimits:
    """FrontLimits from the flags; args.api_key must have been resolved (resolve_api_key) first."""
    return FrontLimits(args.api_key, args.public_metrics, args.max_body_bytes, args.timeout_header,
                       args.timeout_body, args.max_connections, args.api_key_file, allowed_origins(args))


def resolve_api_key(given: str | None, flag: str = "--api-key") -> str | None:
    """The key given by `flag`, else $RIDGELINE_API_KEY (removed from this process's environment),
    else None: no key. An empty key, or one that cannot travel in an HTTP header, is an error."""
    env = os.environ.pop(API_KEY_ENV, None)
    key, where = (given, flag) if given is not None else (env, f"${API_KEY_ENV}")
    if key is None:
        return None
    if not key.strip():
        raise InvalidRequestError(f"{where} is empty: give a key, or leave {flag} out and unset ${API_KEY_ENV} to "
                                  "serve without one", flag.lstrip("-").replace("-", "_"))
    if key != key.strip() or not key.isascii() or not key.isprintable():
        raise InvalidRequestError(f"{where} must be printable ASCII without leading or trailing spaces (it is sent "
                                  "in an HTTP header)", flag.lstrip("-").replace("-", "_"))
    return key


def new_api_key() -> str:
    """A key for one launch's internal servers (replicas, workers), which only their front knows."""
    return secrets.token_urlsafe(32)


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def exposure_warning(host: str, api_key: str | None, what: str = "the server") -> str | None:
    """api_key: whatever authenticates clients (a key, or a key file's path)."""
    if api_key or is_loopback(host):
        return None
    where = "every interface" if host.strip("[]") in ("", "0.0.0.0", "::") else host
    return (f"warning   {what} listens on {where} without --api-key: anyone who can reach it can use it "
            f"(give --api-key KEY or ${API_KEY_ENV}, or --host 127.0.0.1)")


def warn_if_exposed(host: str, api_key: str | None, what: str = "the server") -> None:
    message = exposure_warning(host, api_key, what)
    if message is not None:
        print(message, file=sys.stderr, flush=True)
