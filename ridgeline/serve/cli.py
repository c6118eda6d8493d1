"""`ridgeline serve`: registered into ridgeline.cli by its plugin hook."""
from __future__ import annotations

import argparse
import logging
import os

from ridgeline.cli import add_engine_args, engine_kwargs
from ridgeline.errors import InvalidRequestError, RidgelineError


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/chat/completions, "
                                            "/v1/completions, /v1/models, /health, /metrics)")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for every interface")
    g.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    g.add_argument("--api-key", default=os.environ.get("RIDGELINE_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1 routes (default: $RIDGELINE_API_KEY)")
    g.add_argument("--served-model-name", default=None, help="the `model` clients name (default: --model)")
    g.add_argument("--max-waiting", type=int, default=1024,
                   help="requests allowed to wait for their first token; more get 429")
    g.add_argument("--max-body-bytes", type=int, default=8 << 20, help="larger request bodies get 413")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGINT/SIGTERM")
    g.add_argument("--access-log", action="store_true", help="log one line per HTTP request")
    g.add_argument("--log-requests", default=None, metavar="FILE",
                   help="append each request body to FILE as a JSON line, input for `ridgeline cache-report` "
                        "(default: none)")
    add_engine_args(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ridgeline.config import EngineConfig
    from ridgeline.engine.async_engine import build_off_main_thread
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import bind, serve_forever, url_of
    from ridgeline.serve.state import ServerSettings

    if args.max_waiting < 0 or args.max_body_bytes < 1 or args.drain_timeout < 0:
        raise InvalidRequestError("--max-waiting must be >= 0, --max-body-bytes >= 1, --drain-timeout >= 0")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        sock = bind(args.host, args.port)  # before loading: a busy port fails in a second, not a minute
    except OSError as e:
        raise RidgelineError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from None
    config = EngineConfig.from_kwargs(args.model, **engine_kwargs(args))
    engine = build_off_main_thread(lambda: LLMEngine(config))
    name = args.served_model_name or args.model
    settings = ServerSettings(name, args.api_key, args.max_waiting, args.max_body_bytes, args.drain_timeout,
                              args.log_requests)
    print(engine.info.summary(), flush=True)
    print(f"serving   `{name}` at {url_of(sock)}/v1 (auth {'on' if args.api_key else 'off'}); "
          "Ctrl-C drains and stops", flush=True)
    serve_forever(build_app(engine, settings), sock, args.drain_timeout, args.access_log)
    return 0

