"""`ridgeline bench models`: `ridgeline serve --models a=MODEL,b=SECOND` on this machine, measured as a user
meets it: the first request to `a` (its process started then, the model loaded, 3 tokens), a warm request,
then a stream of `--stream-tokens` on `a` during which `b` is requested for the first time: `b`'s cold load
and `a`'s time per output token (median, p90) against the same stream on `a` alone, and whether any request
failed. The server is left `--settle` seconds before the first request (its spare process warming)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from ridgeline.cli_parser import output_file, positive_int


def add_models_parser(sub) -> None:
    p = sub.add_parser("models", help="serve --models: cold load of a model, and another's TPOT during it",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="model `a` (default: %(default)s)")
    p.add_argument("--second", default=None, help="model `b` (default: --model again, in a process of its own)")
    p.add_argument("--stream-tokens", type=positive_int, default=300, metavar="N",
                   help="tokens of the stream on `a` timed alone and during `b`'s load (default: %(default)s)")
    p.add_argument("--settle", type=float, default=5.0, metavar="SECONDS",
                   help="wait after the server is up, before the first request (default: %(default)s)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the results as JSON (default: none)")
    p.set_defaults(func=cmd_models)


def _complete(url: str, model: str, n: int) -> tuple[float, int]:
    import httpx
    t = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": "Once upon a time", "max_tokens": n,
                                                  "temperature": 0, "ignore_eos": True}, timeout=600)
    return time.perf_counter() - t, r.status_code


def _stream_gaps(url: str, model: str, n: int, out: dict) -> None:
    """Seconds between streamed chunks carrying text, into out["gaps"]; out["status"] the HTTP status."""
    import httpx
    stamps = []
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as s:
        out["status"] = s.status_code
        for line in s.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    out["gaps"] = [b - a for a, b in zip(stamps, stamps[1:])]


def _p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def cmd_models(args: argparse.Namespace) -> int:
    from ridgeline.bench.serve import LaunchedServer
    from ridgeline.utils.api_key_env import env_with_api_key

    second = args.second or args.model
    cmd = [sys.executable, "-m", "ridgeline.cli", "serve", "--models", f"a={args.model},b={second}", "--host",
           "127.0.0.1", "--port", "0", "--quiet", "--keep-alive", "-1"]
    with LaunchedServer(cmd, env=env_with_api_key(None)) as server:
        url = server.url
        time.sleep(args.settle)
        cold, s1 = _complete(url, "a", 3)
        time.sleep(args.settle)  # the spare that replaced a's, warming
        warm, s2 = _complete(url, "a", 3)
        alone: dict = {}
        _stream_gaps(url, "a", args.stream_tokens, alone)
        during: dict = {}
        stream = threading.Thread(target=_stream_gaps, args=(url, "a", args.stream_tokens, during))
        stream.start()
        time.sleep(0.3)
        load_b, s3 = _complete(url, "b", 3)
        stream.join()
    statuses = [s1, s2, s3, alone.get("status"), during.get("status")]
    idle, busy = statistics.median(alone["gaps"]), statistics.median(during["gaps"])
    res = {"model": args.model, "second": second, "cold_load_s": cold, "warm_s": warm, "load_b_during_stream_s": load_b,
           "tpot_alone_ms": idle * 1e3, "tpot_during_load_ms": busy * 1e3,
           "tpot_during_load_p90_ms": _p(during["gaps"], 0.9) * 1e3, "tpot_ratio": busy / idle,
           "failed": sum(s != 200 for s in statuses)}
    print(f"serve --models a={args.model},b={second}")
    print(f"first request to a (process start, load, 3 tokens)   {cold:6.2f} s")
    print(f"warm request to a (3 tokens)                          {warm:6.3f} s")
    print(f"first request to b while a streams                    {load_b:6.2f} s")
    print(f"a's TPOT alone / during b's load (median)             {idle * 1e3:6.2f} / {busy * 1e3:.2f} ms "
          f"({busy / idle:.2f}x; p90 during {res['tpot_during_load_p90_ms']:.1f} ms)")
    print(f"failed requests                                       {res['failed']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["failed"] else 0
