"""`ridgeline bench serve`: online serving benchmark against an OpenAI-compatible HTTP server.

With --url it measures a running server (Ridgeline, vLLM, llama.cpp's llama-server, ...); without it,
it starts `ridgeline serve` on a free 127.0.0.1 port with the given engine options, and stops it after.
Prompts come from a fixed-seed workload (the same token ids `bench throughput` uses), tokenized with
--tokenizer (default: --model) and sent as token ids to /v1/completions (--prompt-format ids), as text
(text), or as the chat messages they were rendered from to /v1/chat/completions (chat). Every request
is greedy with `ignore_eos` and `max_tokens = --output-len`, streamed.

Reported (client side, from each request's send): TTFT, TPOT = (e2e - TTFT) / (output tokens - 1),
inter-token latency (gaps between streamed chunks), e2e latency (mean, p50, p90, p99), request and token
throughput over the run, failed requests, goodput (requests/s meeting every SLO given), and the server's
prefix-cache hit rate over the run when its /metrics has prefix_cache_queries/hits counters; from a
Ridgeline server also the concurrency before its first preemption (the most requests holding KV blocks
at once until then, and how many held them at it).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import platform
import queue
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from ridgeline.bench.loadgen import (LoadConfig, RequestSpec, loop_lag_delta, parse_prometheus, preemption_concurrency,
                                     prefix_cache_delta, summarize)
from ridgeline.cli_parser import non_negative_int, output_file, positive_float, positive_float_or_inf, positive_int
from ridgeline.errors import InvalidRequestError, RidgelineError
from ridgeline.utils.api_key_env import API_KEY_ENV, env_with_api_key


# ---------------------------------------------------------------- tokenizer and workload

class _RecordingTokenizer:
    """Wraps a tokenizer so the chat messages behind each rendered prompt can be looked up by its ids."""

    def __init__(self, tok):
        self._tok = tok
        self.messages: dict[tuple[int, ...], list[dict]] = {}

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        ids = self._tok.encode_chat(messages, add_generation_prompt)
        self.messages[tuple(ids)] = [dict(m) for m in messages]
        return ids

    def __getattr__(self, name):
        return getattr(self._tok, name)


def load_tokenizer(spec: str):
    """A Ridgeline Tokenizer for a model spec; a hub id fetches only the tokenizer files."""
    from ridgeline.models.resolve import HUB_ID, resolve_model
    from ridgeline.weights.tokenizer import Tokenizer

    path = Path(spec).expanduser()
    if path.is_dir() and (path / "tokenizer.json").exists():
        return Tokenizer(path)
    if HUB_ID.fullmatch(spec) and not path.exists():
        try:
            from huggingface_hub import snapshot_download
            patterns = ["tokenizer*", "*.jinja", "special_tokens_map.json", "generation_config.json"]
            try:
                folder = snapshot_download(spec, allow_patterns=patterns, local_files_only=True)
            except Exception:
                folder = snapshot_download(spec, allow_patterns=patterns, etag_timeout=5)
            return Tokenizer(Path(folder))
        except Exception:
            pass  # resolve_model gives the error that names the problem
    return Tokenizer(resolve_model(spec, progress=False))


def build_requests(args: argparse.Namespace, tok, num_requests: int, seed: int) -> list[RequestSpec]:
    from ridgeline.bench.workloads import make_workload
    rec = _RecordingTokenizer(tok)
    try:
        prompts = make_workload(args.workload, rec if args.prompt_format == "chat" else tok, num_requests,
                                min_len=args.min_prompt, max_len=args.max_prompt, prefix_len=args.prefix_len,
                                seed=seed, conversations=args.conversations, turns=args.turns)
    except ValueError as e:
        raise InvalidRequestError(f"workload {args.workload!r}: {e}") from None
    specs = []
    for ids in prompts:
        spec = RequestSpec(list(ids))
        if getattr(ids, "tools", None) is not None:  # the tools workload: the client's messages and its tools
            spec.tools = ids.tools
        elif getattr(ids, "structured", None) is not None:  # a structured workload's prompt
            spec.schema, spec.schema_name = json.loads(ids.structured.json), ids.schema
        if args.prompt_format == "chat":
            spec.messages = getattr(ids, "chat", None) or rec.messages.get(tuple(ids))
            if spec.messages is None:
                raise InvalidRequestError(f"workload {args.workload!r} does not render its prompts from chat "
                                          "messages; use --prompt-format ids or text")
        elif args.prompt_format == "text":
            spec.text = tok.decode(ids, skip_special_tokens=False)
        specs.append(spec)
    return specs


# ---------------------------------------------------------------- a server of our own

def engine_cli_args(args: argparse.Namespace) -> list[str]:
    """The engine options given to this command, as `ridgeline serve` flags (defaults left out)."""
    from ridgeline.engine.args import add_engine_args
    p = argparse.ArgumentParser(add_help=False)
    add_engine_args(p)
    out: list[str] = []
    for a in p._actions:
        if not a.option_strings:
            continue
        value = getattr(args, a.dest, a.default)
        if value == a.default and a.dest != "model":
            continue
        if a.nargs == 0:  # store_true / store_false: the flag itself
            out.append(a.option_strings[0])
        else:
            out += [a.option_strings[0], str(value)]
    return out


class LaunchedServer:
    """`ridgeline serve` as a child process on a free loopback port; a context manager."""

    def __init__(self, cmd: list[str], startup_timeout: float = 600.0, echo=sys.stderr, env: dict | None = None):
        self.cmd = cmd
        self.env = env  # None: this process's (an API key goes here, never in cmd: any local user can read that)
        self.startup_timeout = startup_timeout
        self.echo = echo
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.startup: list[str] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self._lines: queue.Queue[str | None] = queue.Queue()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.tail.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def start(self) -> LaunchedServer:
        import httpx
        from ridgeline.utils.lifetime import end_with_parent
        # the server ends with this process, even when it is killed before __exit__ runs
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.DEVNULL, preexec_fn=end_with_parent, env=self.env)
        threading.Thread(target=self._read, name="ridgeline-serve-log", daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout
        try:
            while self.url is None:
                try:
                    line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    raise RuntimeError(f"the server did not start in {self.startup_timeout:g}s") from None
                if line is None:
                    raise RuntimeError(f"the server exited with status {self.proc.wait()}")
                self.startup.append(line)
                if self.echo and not line.startswith("INFO"):
                    print(f"  [serve] {line.rstrip()}", file=self.echo, flush=True)
                m = re.search(r" at (https?://\S+?)/v1\b", line) if line.startswith("serving") else None
                if m:
                    self.url = m.group(1)
            while True:
                try:
                    if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server at {self.url} never became healthy")
                time.sleep(0.05)
        except BaseException as e:
            self.stop()
            if isinstance(e, RuntimeError):
                raise RidgelineError(f"{e}; its output:\n" + "".join(self.tail)) from None
            raise
        return self

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)  # drain, then exit 0
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> LaunchedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_command(args: argparse.Namespace, served_name: str) -> list[str]:
    cmd = [sys.executable, "-m", "ridgeline.cli", "serve", "--host", "127.0.0.1", "--port", "0",
           "--served-model-name", served_name, "--max-waiting", str(max(1024, args.num_requests)),
           "--drain-timeout", "10", *engine_cli_args(args)]
    return cmd + shlex.split(args.server_args or "")  # the API key goes by environment (LaunchedServer's env)


# ---------------------------------------------------------------- talking to the server

def server_models(url: str, headers: dict) -> list[dict]:
    import httpx
    try:
        r = httpx.get(url + "/v1/models", headers=headers, timeout=30)
        if r.status_code == 200:
            return [m for m in r.json().get("data", []) if isinstance(m, dict)]
    except httpx.ConnectError as e:
        raise RidgelineError(f"cannot connect to {url}: {e}") from None
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return []


def scrape_metrics(url: str, headers: dict) -> dict[str, float] | None:
    import httpx
    try:
        r = httpx.get(url + "/metrics", headers=headers, timeout=30)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or "json" in r.headers.get("content-type", ""):
        return None
    return parse_prometheus(r.text)


def _run(url: str, specs: list[RequestSpec], cfg: LoadConfig, headers: dict, progress: bool,
         desc: str, max_tokens: int | None = None):
    from tqdm import tqdm

    from ridgeline.bench.loadgen import run_load
    bar = tqdm(total=len(specs), desc=desc, unit="req", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    failed = 0

    def done(res):
        nonlocal failed
        failed += not res.ok
        bar.update(1)
        if failed:
            bar.set_postfix(failed=failed)

    try:
        return asyncio.run(run_load(url, specs, cfg, headers, done, max_tokens))
    finally:
        bar.close()


# ---------------------------------------------------------------- report

def _ms(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 1000:.1f}"


def format_report(s: dict, meta: dict) -> str:
    W = 44
    line = lambda k, v: f"{k:<{W - 1}} {v}"  # noqa: E731
    out = ["=" * 28 + " Serving Benchmark Result " + "=" * 28,
           line("Server:", meta["server_desc"]),
           line("Model:", meta["model"]),
           line("Workload:", meta["workload_desc"]),
           line("Load:", meta["load_desc"]),
           line("Successful requests:", s["completed"]),
           line("Failed requests:", s["failed"]),
           line("Benchmark duration (s):", f"{s['duration_s']:.2f}"),
           line("Total prompt tokens:", s["prompt_tokens"]),
           line("Total output tokens:", s["output_tokens"]),
           line("Request throughput (req/s):", f"{s['request_throughput']:.3f}"),
           line("Output token throughput (tok/s):", f"{s['output_throughput']:.1f}"),
           line("Total token throughput (tok/s):", f"{s['total_token_throughput']:.1f}")]
    if s["slo"]:
        names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}
        slo = ", ".join(f"{names[k]}<={v * 1000:g}ms" for k, v in s["slo"].items())
        out.append(line(f"Goodput (req/s) [{slo}]:", f"{s['goodput']:.3f} ({s['good_requests']} of "
                                                        f"{s['completed'] + s['failed']} requests)"))
    pc = meta.get("prefix_cache")
    if pc is not None:
        rate = "-" if pc["hit_rate"] is None else f"{pc['hit_rate']:.1%}"
        out.append(line("Prefix cache hit rate (server /metrics):",
                        f"{rate} ({pc['hits']:.0f} of {pc['queries']:.0f} prompt tokens)"))
        if pc.get("tier_hits") is not None:
            out.append(line("  of them from the offload tier:", f"{pc['tier_hits']:.0f} tokens ({pc['tier_loads']:.0f} "
                                                                   f"blocks loaded, {pc['tier_stores']:.0f} stored)"))
        if pc.get("preemptions"):
            swaps = f", {pc['swaps_out']:.0f} swapped out" if pc.get("swaps_out") is not None else ""
            redo = f", {pc['recomputed_tokens']:.0f} tokens recomputed" if pc.get("recomputed_tokens") is not None else ""
            out.append(line("Preemptions (server /metrics):", f"{pc['preemptions']:.0f}{swaps}{redo}"))
    out += _concurrency_lines(meta.get("kv_concurrency"), line)
    lag = meta.get("loop_lag")
    if lag is not None and lag["probes"]:
        out.append(line("Event-loop probes late (server /metrics):",
                        f"{lag['late']:.0f} of {lag['probes']:.0f} woke over {lag['late_s'] * 1000:g} ms late "
                        f"(mean lateness {lag['mean_lag_s'] * 1000:.2f} ms)"))
    if s["cached_prompt_tokens"] is not None and s["prompt_tokens"]:
        out.append(line("Cached prompt tokens (usage):", f"{s['cached_prompt_tokens']} "
                                                         f"({s['cached_prompt_tokens'] / s['prompt_tokens']:.1%})"))
    head = f"{'(ms)':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}"
    out += ["-" * 80, head]
    for name, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s")):
        d = s[key]
        out.append(f"{name:<10}" + "".join(f"{_ms(d[k]):>10}" for k in ("mean", "p50", "p90", "p99", "max")))
    for kind, ks in (s.get("by_kind") or {}).items():
        d = ks["tpot_s"]
        out.append(f"{'TPOT ' + ('json' if kind == 'structured' else kind):<10}" + "".join(f"{_ms(d[k]):>10}" for k in ("mean", "p50", "p90", "p99", "max"))
                   + f"  ({ks['completed']} requests)")
    out.append("=" * 80)
    for e in s["errors"]:
        out.append(f"failed x{e['count']}: {e['error']}")
    return "\n".join(out)


def _concurrency_lines(c: dict | None, line) -> list[str]:
    """The server's requests holding KV blocks: the most before the first preemption, and at it."""
    if c is None:
        return []
    if c["first_preemption_in_run"]:
        return [line("Concurrency before first preemption (server):",
                     f"{c['max_running_before_first_preemption']:.0f} requests holding KV at most "
                     f"({c['running_at_first_preemption']:.0f} at the preemption)")]
    if c["preempted_before_run"]:
        return [line("Concurrency before first preemption (server):", "- (the server preempted before the run)")]
    return [line("Concurrency, no preemption (server):",
                 f"at most {c['max_running_since_start']:.0f} requests holding KV (since the server started)")]


def _finite(x):
    """NaN (a statistic of no values) -> None, so the JSON is strict."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def _machine() -> dict:
    from ridgeline.measure.record import cpu_model
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


# ---------------------------------------------------------------- the command

def cmd_serve_bench(args: argparse.Namespace) -> int:
    from ridgeline.bench.throughput import check_workload_args
    check_workload_args(args)  # each flag's own range is checked as it is parsed
    wall0 = time.perf_counter()
    seed = args.workload_seed if args.workload_seed is not None else args.seed
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        extra_body = json.loads(args.extra_body) if args.extra_body else {}
    except ValueError as e:
        raise InvalidRequestError(f"--extra-body is not JSON: {e}") from None
    if not isinstance(extra_body, dict):
        raise InvalidRequestError("--extra-body must be a JSON object")
    progress = not args.no_progress

    tok_spec = args.tokenizer or args.model
    tok = load_tokenizer(tok_spec)
    specs = build_requests(args, tok, args.num_requests, seed)
    warm = build_requests(args, tok, args.num_warmup, seed + 10_000) if args.num_warmup else []
    lens = [len(s.prompt_ids) for s in specs]
    workload_desc = (f"{args.workload} (seed {seed}), {len(specs)} requests, prompts {min(lens)}-{max(lens)} "
                     f"tokens (mean {statistics.mean(lens):.0f}) as {args.prompt_format}, "
                     f"{args.output_len} output tokens each")
    if args.workload == "multi-turn":
        workload_desc += f"; {args.conversations} conversations of {args.turns} turns interleaved"
    print(f"workload   {workload_desc}", file=sys.stderr)

    server = None
    if args.url:
        url = args.url.rstrip("/").removesuffix("/v1")
        server_desc = url
        ignored = engine_cli_args(args)[2:]
        if ignored:
            print(f"note       engine options are for a server the bench starts; ignored with --url: "
                  f"{' '.join(ignored)}", file=sys.stderr)
    else:
        name = args.served_model_name or args.model
        server = LaunchedServer(serve_command(args, name), args.server_timeout,
                                echo=sys.stderr if progress else None, env=env_with_api_key(args.api_key))
        print(f"starting   {shlex.join(server.cmd[1:])}", file=sys.stderr, flush=True)
        url = server.start().url
        server_desc = f"ridgeline serve (started by the bench) at {url}"
    try:
        models = server_models(url, headers)
        ids = [m.get("id") for m in models]
        model = args.served_model_name or (args.model if args.model in ids or not ids else ids[0])
        if args.url and not args.tokenizer and model != args.model:
            print(f"note       prompts are tokenized with {tok_spec!r} (--model); the server serves {model!r}: "
                  "give --tokenizer if that is another model", file=sys.stderr)
        endpoint = "chat" if args.prompt_format == "chat" else "completions"
        cfg = LoadConfig(endpoint, args.prompt_format, model, args.output_len, args.request_rate,
                         args.concurrency, seed, not args.no_stream_usage, args.request_timeout,
                         extra_body=extra_body)
        if warm:
            wcfg = LoadConfig(**{**cfg.__dict__, "request_rate": math.inf,
                                 "max_concurrency": min(args.concurrency or len(warm), len(warm))})
            wres, _ = _run(url, warm, wcfg, headers, progress, "warm-up", max_tokens=min(args.output_len, 16))
            bad = [r for r in wres if not r.ok]
            if len(bad) == len(wres):
                print(f"warm-up failed: {bad[0].error}", file=sys.stderr)
        before = scrape_metrics(url, headers)
        results, duration = _run(url, specs, cfg, headers, progress, "bench")
        after = scrape_metrics(url, headers) if before is not None else None
    finally:
        if server is not None:
            rc = server.stop()
            if rc not in (0, None):
                print(f"the server exited with status {rc}", file=sys.stderr)

    slo = {"ttft": args.slo_ttft, "tpot": args.slo_tpot, "e2e": args.slo_e2e}
    s = summarize(results, duration, slo)
    pc = prefix_cache_delta(before, after)
    conc = preemption_concurrency(before, after)
    if args.request_rate == math.inf:
        load_desc = f"concurrency {args.concurrency}" if args.concurrency else "all requests at once"
    else:
        load_desc = f"Poisson arrivals at {args.request_rate:g} req/s (seed {seed})"
        if args.concurrency:
            load_desc += f", at most {args.concurrency} in flight"
    meta = {"server_desc": server_desc, "model": model, "workload_desc": workload_desc, "load_desc": load_desc,
            "prefix_cache": pc, "kv_concurrency": conc, "loop_lag": loop_lag_delta(before, after)}
    if any(sp.schema is not None for sp in specs) and any(sp.schema is None for sp in specs):  # the kinds apart
        s["by_kind"] = {kind: summarize([r for r in results if (specs[r.index].schema is not None) == constrained],
                                        duration) for kind, constrained in (("plain", False), ("structured", True))}
    print()
    print(format_report(s, meta))
    ok = [r for r in results if r.ok]
    short = [r for r in ok if r.output_tokens != args.output_len]
    if short:
        how = ("usage" if all(r.output_tokens_source == "usage" for r in short) else
               "streamed chunks (no usage chunk: a chunk may carry several tokens)")
        print(f"note: {len(short)} requests did not report {args.output_len} output tokens (counted from {how})")
    wall = time.perf_counter() - wall0

    if args.json:
        from ridgeline.measure.record import write_json
        write_json(args.json, _finite({
            "command": "bench serve", "label": args.label, "machine": _machine(),
            "server": {"url": url, "started_by_bench": server is not None,
                       "command": server.cmd if server is not None else None,
                       "startup_output": "".join(server.startup) if server is not None else None,
                       "models": models},
            "model": model, "tokenizer": tok_spec,
            "workload": {"name": args.workload, "seed": seed, "num_requests": len(specs),
                         "min_prompt": args.min_prompt, "max_prompt": args.max_prompt, "prefix_len": args.prefix_len,
                         "conversations": args.conversations, "turns": args.turns,
                         "prompt_tokens": sum(lens), "prompt_format": args.prompt_format,
                         "output_len": args.output_len, "num_warmup": len(warm)},
            "load": {"concurrency": args.concurrency,
                     "request_rate": None if math.isinf(args.request_rate) else args.request_rate,
                     "arrivals": "all at once" if math.isinf(args.request_rate) else "poisson",
                     "request_timeout_s": args.request_timeout, "stream_usage": not args.no_stream_usage,
                     "extra_body": extra_body},
            "summary": s, "prefix_cache": pc, "kv_concurrency": conc,
            "requests": [r.to_dict() for r in results], "wall_s": wall}))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        from ridgeline.bench.plot import plot_latency
        title = f"{args.label or Path(model).name or model}: {args.workload}, {load_desc}"
        plot_latency(results, args.plot, title=title, slo=s["slo"])
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0 if ok else 1


def add_serve_parser(bsub) -> argparse.ArgumentParser:
    from ridgeline.bench.throughput import add_workload_args
    p = bsub.add_parser("serve", help="online serving benchmark (TTFT, TPOT, ITL, goodput) against an "
                                      "OpenAI-compatible server, or a `ridgeline serve` it starts",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--url", default=None, help="base URL of a running server (e.g. http://127.0.0.1:8080); "
                                               "default: none, a `ridgeline serve` is started with the engine options")
    g.add_argument("--served-model-name", default=None,
                   help="the `model` of each request body (default: --model if the server lists it, else the "
                        "first model its /v1/models lists)")
    g.add_argument("--tokenizer", default=None, help="tokenizer for the workload prompts (default: --model)")
    g.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help="sent as a Bearer token (default: $RIDGELINE_API_KEY)")
    g.add_argument("--server-args", default=None,
                   help="extra `ridgeline serve` flags for a started server, given as --server-args='--flag value' "
                        "(default: none)")
    g.add_argument("--server-timeout", type=positive_float, default=600.0, help="seconds a started server gets to load")
    add_workload_args(p, seed_default=None, structured=True)
    g = p.add_argument_group("load")
    g.add_argument("--prompt-format", default="ids", choices=["ids", "text", "chat"],
                   help="ids: token ids to /v1/completions (exact prompt lengths); text: the decoded prompt to "
                        "/v1/completions; chat: the messages to /v1/chat/completions")
    g.add_argument("--concurrency", type=positive_int, default=None, metavar="N",
                   help="at most this many requests in flight (default: no limit)")
    g.add_argument("--request-rate", type=positive_float_or_inf, default=math.inf,
                   help="Poisson arrivals at this many requests/s, seeded by --seed (default: inf, all at once)")
    g.add_argument("--num-warmup", type=non_negative_int, default=2, help="untimed warm-up requests (other prompts)")
    g.add_argument("--request-timeout", type=positive_float, default=600.0, help="seconds per request")
    g.add_argument("--no-stream-usage", action="store_true",
                   help="do not ask for a usage chunk (stream_options); count output tokens from chunks")
    g.add_argument("--extra-body", default=None,
                   help='JSON merged into each request body, e.g. \'{"cache_prompt": true}\' (default: none)')
    g = p.add_argument_group("report")
    g.add_argument("--slo-ttft", type=positive_float, default=None,
                   help="TTFT SLO in seconds for goodput (default: none)")
    g.add_argument("--slo-tpot", type=positive_float, default=None,
                   help="TPOT SLO in seconds for goodput (default: none)")
    g.add_argument("--slo-e2e", type=positive_float, default=None,
                   help="e2e latency SLO in seconds for goodput (default: none)")
    g.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write all results, summary and per request, to FILE (default: none)")
    g.add_argument("--plot", type=output_file, default=None, metavar="PNG",
                   help="write a latency-distribution PNG: TTFT, TPOT, ITL, e2e (default: none)")
    g.add_argument("--label", default=None, help="a name for this run in the JSON and the plot title (default: none)")
    g.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.set_defaults(func=cmd_serve_bench)
    return p
