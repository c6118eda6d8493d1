"""`ridgeline serve [MODEL]`: registered into ridgeline.cli by its plugin hook."""
from __future__ import annotations

import argparse
import logging

from ridgeline.cli import add_engine_args, engine_kwargs
from ridgeline.cli_parser import positive_int
from ridgeline.errors import InvalidRequestError, RidgelineError
from ridgeline.http.front_limits import (add_front_args, allowed_origins, front_problems, resolve_api_key,
                                          warn_if_exposed)
from ridgeline.serve.pooling import SETTINGS as POOLING
from ridgeline.serve.settings import ServerSettings

_D = ServerSettings("")  # the defaults the flags show


class _DefaultModel(str):
    """--model's default, marked: `serve MODEL` may then name another model without a conflict."""


def _request_defaults() -> str:
    from ridgeline.sampling_params import SamplingParams
    d = SamplingParams()
    return (f"Default sampling, for a request that omits these fields: temperature {d.temperature:g}, "
            f"top_p {d.top_p:g}, top_k {d.top_k or 'off'}, min_p {d.min_p:g}, no penalties, no seed; "
            f"max_tokens {d.max_tokens} on /v1/completions (OpenAI's default), up to the context length on "
            "/v1/chat/completions. Send temperature 0 for greedy, reproducible output.")


def register(subparsers, command: str | None = None) -> None:
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, "
                      "/health, /metrics, /docs)",
        description="Serve MODEL over an OpenAI-compatible HTTP API. " + _request_defaults())
    p.add_argument("model_positional", nargs="?", metavar="MODEL", default=None,
                   help="the model, as with --model (give one or the other; default: --model's)")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    g.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default: %(default)s)")
    add_front_args(g)  # --api-key, --public-metrics, --max-body-bytes, --timeout-header/-body, --max-connections
    g.add_argument("--tenant-header", action="store_true",
                   help="behind `ridgeline router --api-key-file`: requests carrying this server's --api-key (the "
                        "router's --replica-api-key) name their tenant in x-ridgeline-tenant (default: off)")
    g.add_argument("--served-model-name", default=None, help="the `model` clients name (default: the model)")
    g.add_argument("--pooling", default=_D.pooling, choices=POOLING,
                   help="how /v1/embeddings reads a vector from the final hidden states: auto (a sentence-transformers "
                        "folder's Pooling config, else last), last (the last token's: decoder embedding models), mean, "
                        "or cls (the first token's) (default: %(default)s)")
    g.add_argument("--reasoning-parser", default=_D.reasoning_parser, choices=_reasoning_parsers(),
                   help="split a reasoning model's thinking into `reasoning_content`: auto (the format the chat "
                        "template writes, <think> or [THINK]; none if it writes neither), none, or a format "
                        "(default: %(default)s)")
    g.add_argument("--max-waiting", type=int, default=_D.max_waiting,
                   help="sequences (prompts x n) allowed to wait for their first token; more get 429, "
                        "a single request over it gets 400 (default: %(default)s)")
    g.add_argument("--drain-timeout", type=float, default=_D.drain_timeout,
                   help="on SIGINT/SIGTERM: seconds in-flight requests get to finish before they end with a 503 (default: %(default)s)")
    g.add_argument("--quiet", action="store_true",
                   help="no per-request log lines and no periodic throughput lines (default: both on)")
    g.add_argument("--access-log", action="store_true", help="uvicorn's access log, one line per HTTP request (default: off)")
    g.add_argument("--log-requests", default=None, metavar="FILE",
                   help="append each request body to FILE as a JSON line (input for `ridgeline cache-report`; default: off)")
    g = p.add_argument_group("replicas and routing")
    g.add_argument("--kv-events-endpoint", default=None, metavar="ENDPOINT",
                   help="publish the prefix cache's block stored / removed events on this ZeroMQ PUB endpoint "
                        "(e.g. ipc:///run/ridgeline/kv or tcp://127.0.0.1:5557; unauthenticated, so a wildcard or "
                        "non-loopback tcp address gets a warning), for `ridgeline router --policy cache-aware` "
                        "(default: off)")
    g.add_argument("--data-parallel-size", type=positive_int, default=1, metavar="N",
                   help="N replicas of the model behind this one endpoint, the CPU cores split between them, "
                        "routed by --router-policy (replicas listen on internal loopback ports the OS picks)")
    g.add_argument("--router-policy", default="cache-aware", choices=["round-robin", "least-load", "cache-aware"],
                   help="--data-parallel-size > 1: how a request's replica is picked")
    g.add_argument("--models", default=None, metavar="NAME=MODEL,...",
                   help="serve several models by name behind this endpoint, each in its own process started on the "
                        "first request naming it (NAME=MODEL, or MODEL named as given; or a folder of model folders "
                        "and .gguf files, each named by its folder or file stem); the engine flags apply to each "
                        "(default: one model, the positional one)")
    g.add_argument("--keep-alive", type=float, default=300.0, metavar="SECONDS",
                   help="--models: stop a model after this many seconds without a request (0: as soon as it is "
                        "idle; negative: never) (default: %(default)s)")
    g.add_argument("--models-memory", default=None, metavar="SIZE",
                   help="--models: the most the loaded models may hold (weight files + KV budget each, e.g. 8GiB); "
                        "the least recently used idle model is stopped to start another (default: no limit)")
    g.add_argument("--executor", default="process", choices=["process", "ray"],
                   help="--data-parallel-size: start replicas as processes on this machine, or as Ray actors on "
                        "an existing Ray cluster (`ray start --head`; placement by CPUs)")
    g.add_argument("--ray-address", default="auto",
                   help="--executor ray: the cluster to join (ray.init's address)")
    g.add_argument("--ray-cpus-per-replica", type=positive_int, default=None, metavar="N",
                   help="--executor ray: CPUs each replica actor asks for, and its threads (default: the "
                        "cluster's CPUs / --data-parallel-size)")
    g.add_argument("--ray-kv-events", default="ipc", choices=["ipc", "tcp"],
                   help="--executor ray, cache-aware: replicas publish KV events on ipc:// on their own machine "
                        "(only replicas on this machine can be followed), or on tcp on their node's address "
                        "(unauthenticated: a private network only)")
    c = p.add_argument_group("web console")
    c.add_argument("--no-console", dest="console", action="store_false",
                   help="no web console at / (chat playground, live view, calculators); / is then 404 "
                        "(default: the console is on)")
    _add_limit_args(p)
    add_engine_args(p)
    _add_disagg_args(p)
    p.set_defaults(func=cmd_serve, model=_DefaultModel(p.get_default("model")), parser=p)


def _add_disagg_args(p) -> None:
    g = p.add_argument_group("prefill/decode disaggregation")
    g.add_argument("--role", default="colocated", choices=["colocated", "prefill", "decode"],
                   help="prefill: compute prompts (max_tokens 1) for the front, on an internal endpoint, and ship "
                        "their KV to a decode worker; decode: accept transferred KV and generate; colocated: both")
    g.add_argument("--disaggregate", default=None, metavar="xPyD",
                   help="start x prefill and y decode worker processes (e.g. 1P1D) behind one OpenAI endpoint "
                        "on --host/--port (default: off, one co-located engine)")
    g.add_argument("--kv-connector", default="tcp", choices=["tcp", "shm"],
                   help="how prompt KV travels from prefill to decode workers: tcp (any host), shm (shared memory, "
                        "one host)")
    g.add_argument("--kv-port", type=int, default=0, metavar="PORT",
                   help="decode worker: the KV connector's port on --internal-host (0: any free one; /disagg/info "
                        "names it)")
    g.add_argument("--internal-host", default="127.0.0.1", metavar="HOST",
                   help="--role: the address of the internal channels (a decode worker's KV connector, a prefill "
                        "worker's endpoint for the front): loopback or a private network, never a public one")
    g.add_argument("--internal-port", type=int, default=0, metavar="PORT",
                   help="prefill worker: its internal endpoint's port (0: any free one; /disagg/info names it)")
    # --internal-secret-file is an engine flag (ridgeline/cli.py): ranks, workers and fronts read the same file
    g.add_argument("--kv-inbox-size", default="4GiB", metavar="SIZE",
                   help="decode worker: transferred KV held at once, waiting for its request or for room in the "
                        "pool; a transfer over it is refused (its prompt is computed here)")
    g.add_argument("--internal-max-connections", type=int, default=256, metavar="N",
                   help="--role: connections an internal channel serves at once (one more is closed at once)")
    g.add_argument("--kv-transfer-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a transfer may take; a decode worker recomputes a prompt whose KV is later")
    g.add_argument("--worker-start-timeout", type=float, default=600.0, metavar="S",
                   help="--disaggregate: seconds the workers get to load the model")


# ---- what one request may make the server spend (serve/limits.py) -------------------------------
def _reasoning_parsers() -> tuple[str, ...]:
    from ridgeline.serve.reasoning import PARSERS
    return PARSERS


def _add_limit_args(p) -> None:
    from ridgeline.sampling_params import MAX_N
    g = p.add_argument_group("request limits", "what one request may make the server spend; over a limit is a 400 "
                                               "naming the flag")
    g.add_argument("--max-n", type=int, default=_D.max_n, metavar="N",
                   help=f"choices (`n`) per request, at most {MAX_N} (default: %(default)s)")
    g.add_argument("--max-logprob-entries", type=int, default=_D.max_logprob_entries, metavar="N",
                   help="token logprobs one response may hold: n x (max_tokens, or the context left) x "
                        "(1 + top_logprobs), plus the prompt's with echo (default: %(default)s)")
    g.add_argument("--chat-template-timeout", type=float, default=_D.chat_template_timeout, metavar="S",
                   help="seconds the chat template may take to render one request's messages (it runs in a "
                        "worker process, killed past it) (default: %(default)s)")
    g.add_argument("--chat-template-max-bytes", type=int, default=None, metavar="N",
                   help="bytes the chat template may produce for one request (default: 1 MiB, or the longest "
                        "prompt the context can hold if larger)")


def _limit_settings(args: argparse.Namespace) -> dict:
    return {"max_n": args.max_n, "max_logprob_entries": args.max_logprob_entries,
            "chat_template_timeout": args.chat_template_timeout,
            "chat_template_max_bytes": args.chat_template_max_bytes}


def _limit_problems(args: argparse.Namespace) -> list[str]:
    from ridgeline.sampling_params import MAX_N
    return [f"--{name.replace('_', '-')} must be {rule}" for name, ok, rule in (
        ("max_n", 1 <= args.max_n <= MAX_N, f"in [1, {MAX_N}]"),
        ("max_logprob_entries", args.max_logprob_entries >= 1, ">= 1"),
        ("chat_template_timeout", args.chat_template_timeout > 0, "> 0"),
        ("chat_template_max_bytes", args.chat_template_max_bytes is None or args.chat_template_max_bytes >= 1,
         ">= 1")) if not ok]
# ---- end of the request limits -----------------------------------------------------------------


def _model(args: argparse.Namespace) -> str:
    given, flag = args.model_positional, args.model
    if given is None:
        return str(flag)
    if not isinstance(flag, _DefaultModel) and flag != given:
        raise InvalidRequestError(f"two models given: {given!r} and --model {flag!r}; give one")
    return given


def _check(args: argparse.Namespace) -> None:
    bad = [f"--{name.replace('_', '-')} must be {rule}" for name, ok, rule in (
        ("max_waiting", args.max_waiting >= 1, ">= 1"), ("drain_timeout", args.drain_timeout >= 0, ">= 0"),
        ("port", 0 <= args.port <= 65535, "in [0, 65535]"), ("kv_port", 0 <= args.kv_port <= 65535, "in [0, 65535]"),
        ("kv_transfer_timeout", args.kv_transfer_timeout > 0, "> 0"),
        ("internal_port", 0 <= getattr(args, "internal_port", 0) <= 65535, "in [0, 65535]"),
        ("internal_max_connections", getattr(args, "internal_max_connections", 1) >= 1, ">= 1"),
        ("worker_start_timeout", args.worker_start_timeout > 0, "> 0"))
        if not ok] + front_problems(args)
    bad += _limit_problems(args)
    if getattr(args, "pipeline_parallel_size", 1) > 1:
        if args.role != "colocated" or args.disaggregate is not None:
            bad.append("--pipeline-parallel-size does not run with disaggregation (--role, --disaggregate) yet")
        if args.data_parallel_size > 1 or args.executor == "ray":
            bad.append("--pipeline-parallel-size does not run with data-parallel replicas (--data-parallel-size, "
                       "--executor ray) yet")
    if args.models is not None:
        from ridgeline.serve.models_front import parse_models
        parse_models(args.models)  # a bad list fails before anything starts
        if args.data_parallel_size > 1 or args.executor == "ray" or args.role != "colocated" or \
                args.disaggregate is not None or args.api_key_file is not None or args.model_positional is not None:
            bad.append("--models serves each model in one process of its own: not with a positional model, "
                       "--data-parallel-size, --executor ray, --role, --disaggregate or --api-key-file yet")
    if args.api_key_file is not None and (args.disaggregate is not None or args.role != "colocated"):
        bad.append("--api-key-file (tenants) does not run with disaggregation (--role, --disaggregate) yet; "
                   "give one --api-key")
    if args.disaggregate is not None:
        if args.role != "colocated":
            bad.append("--role and --disaggregate exclude each other: --disaggregate starts the workers itself")
        else:
            from ridgeline.disagg.launch import parse_xpyd
            parse_xpyd(args.disaggregate)  # a bad xPyD fails before any model loads
    from ridgeline.config import parse_bytes
    if parse_bytes(getattr(args, "kv_inbox_size", 1)) < 1:
        bad.append("--kv-inbox-size must be > 0")
    if bad:
        raise InvalidRequestError("; ".join(bad))
    args.api_key = resolve_api_key(args.api_key)  # from here on the key is in args only, not the environment
    if args.tenant_header and args.api_key is None:
        raise InvalidRequestError("--tenant-header needs --api-key: only a request carrying the router's key may "
                                  "name its tenant", "tenant_header")
    if args.api_key is not None and args.api_key_file is not None:
        raise InvalidRequestError("give --api-key (or $RIDGELINE_API_KEY) or --api-key-file, not both", "api_key")


def _torchrun_follower(args: argparse.Namespace) -> bool:
    from ridgeline.distributed.group import torchrun_env
    ranks = max(args.tensor_parallel_size, getattr(args, "expert_parallel_size", 1),
                getattr(args, "pipeline_parallel_size", 1))
    env = torchrun_env() if ranks > 1 else None
    return env is not None and env[0] > 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ridgeline.config import EngineConfig
    from ridgeline.engine.async_engine import build_off_main_thread
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.http.server import bind, url_of
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import serve_forever

    _check(args)
    model = _model(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if _torchrun_follower(args):  # a rank > 0 under torchrun: no HTTP, it follows rank 0's steps
        config = EngineConfig.from_kwargs(model, **engine_kwargs(args))
        build_off_main_thread(lambda: LLMEngine(config)).follow()
        return 0
    warn_if_exposed(args.host, args.api_key or args.api_key_file)
    if args.api_key_file is not None:  # tenants' cache salts: the deployment's secret (its file, if given)
        from ridgeline.utils.internal_auth import deployment_secret
        deployment_secret(args.internal_secret_file)
    if args.disaggregate is not None:
        from ridgeline.disagg.launch import launch
        return launch(args, args.parser, model)
    secret = None
    if args.role != "colocated":  # before loading: a worker without its deployment's secret cannot serve
        from ridgeline.disagg.worker import deployment_secret
        secret = deployment_secret(args.internal_secret_file, args.role)
    try:
        sock = bind(args.host, args.port)  # before loading: a busy port fails in a second, not a minute
    except OSError as e:
        raise RidgelineError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from None
    name = args.served_model_name or model
    settings = ServerSettings(
        name, api_key=args.api_key, max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes,
        drain_timeout=args.drain_timeout, log_requests=args.log_requests, timeout_header=args.timeout_header,
        timeout_body=args.timeout_body, max_connections=args.max_connections, public_metrics=args.public_metrics,
        quiet=args.quiet, kv_events_endpoint=args.kv_events_endpoint, console=args.console,
        api_key_file=args.api_key_file, allowed_origins=allowed_origins(args), tenant_header=args.tenant_header,
        reasoning_parser=args.reasoning_parser, pooling=args.pooling, **_limit_settings(args))
    if args.models is not None:
        from ridgeline.serve.models_front import serve_models
        return serve_models(args, engine_kwargs(args), settings, sock)
    if args.data_parallel_size > 1 or args.executor == "ray":
        from ridgeline.serve.data_parallel import serve_data_parallel
        return serve_data_parallel(args, model, engine_kwargs(args), settings, sock)
    kwargs = engine_kwargs(args)
    if args.role != "colocated":  # a request's KV moves between workers as one block table
        kwargs["hybrid_kv_cache"] = False
    config = EngineConfig.from_kwargs(model, **kwargs)
    engine = build_off_main_thread(lambda: LLMEngine(config))
    app, worker = build_app(engine, settings), None
    if args.role != "colocated":
        from ridgeline.config import parse_bytes
        from ridgeline.disagg.transports import ReceiveLimits, create_connector
        from ridgeline.disagg.worker import DisaggWorker
        from ridgeline.serve.disagg_worker import install
        limits = ReceiveLimits(args.internal_max_connections, parse_bytes(args.kv_inbox_size))
        connector = create_connector(args.kv_connector, args.kv_transfer_timeout, host=args.internal_host,
                                     port=args.kv_port, secret=secret, limits=limits)
        worker = DisaggWorker(args.role, engine, connector, args.kv_transfer_timeout, args.internal_host,
                              args.internal_port, args.internal_max_connections)
        install(app, worker, secret)
    print(engine.info.summary(), flush=True)
    if worker is None:
        print(f"serving   `{name}` at {url_of(sock)}/v1 (auth {'on' if args.api_key else 'off'}); "
              "Ctrl-C drains and stops", flush=True)
    else:  # not "serving": what parses that line (a benchmark, a script) must find the front's, not a worker's
        where = (f" at {worker.connector.address}" if args.role == "decode"
                 else f"; internal endpoint at {worker.endpoint.address}")
        print(f"worker    {args.role} worker for `{name}` at {url_of(sock)}/v1 "
              f"(auth {'on' if args.api_key else 'off'}); KV connector {args.kv_connector}{where}; "
              "Ctrl-C drains and stops", flush=True)
    if args.console:
        print(f"console   {url_of(sock)}/", flush=True)
    try:
        return serve_forever(app, sock, access_log=args.access_log)
    finally:
        if worker is not None:
            worker.close()  # payloads not taken (shared-memory segments) go with it
        engine.close()  # tensor parallelism: stop the other ranks
