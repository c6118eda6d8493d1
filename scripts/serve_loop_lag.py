"""The OpenAI server's event-loop lag while one non-streamed chat request with many logprobs
completes: a probe task on the server's loop sleeps 10 ms again and again and records how late it
wakes; the worst, p99 and median lateness are printed for the request with top_logprobs and, for
comparison, the same request without. A tiny random-weight model (tests/conftest.py) serves it,
so two checkouts can be compared by running this script from each.

    python3 scripts/serve_loop_lag.py [--n 16] [--max-tokens 256] [--top-logprobs 20] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    import httpx
    from conftest import make_tiny_model

    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.serve.app import build_app
    from ridgeline.serve.server import ServerThread
    from ridgeline.serve.state import ServerSettings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--top-logprobs", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    folder = make_tiny_model(Path(tempfile.mkdtemp()), "llama")
    engine = LLMEngine(EngineConfig.from_kwargs(str(folder), progress=False, dtype="float32",
                                                kv_cache_memory="24MiB", max_num_batched_tokens=512))
    srv = ServerThread(build_app(engine, ServerSettings("tiny", quiet=True))).start()
    loop = srv.server.servers[0].get_loop()

    def measure(body: dict, label: str) -> None:
        lags: list[float] = []
        stop = False

        async def probe():
            while not stop:
                t0 = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - t0 - 0.01)

        fut = asyncio.run_coroutine_threadsafe(probe(), loop)
        t = time.monotonic()
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=600)
        wall = time.monotonic() - t
        stop = True
        fut.result(10)
        assert r.status_code == 200, r.text[:300]
        lags.sort()
        print(f"{label:16s} {wall:5.2f} s, {len(r.content) / 1e6:4.1f} MB: loop lag worst {lags[-1] * 1e3:6.1f} ms, "
              f"p99 {lags[int(len(lags) * 0.99)] * 1e3:6.1f} ms, median {lags[len(lags) // 2] * 1e3:5.2f} ms", flush=True)

    base = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": args.n,
            "max_tokens": args.max_tokens, "temperature": 1, "seed": 1, "ignore_eos": True}
    try:
        measure(base, "warm-up")
        for _ in range(args.rounds):
            measure(base, "no logprobs")
            measure({**base, "logprobs": True, "top_logprobs": args.top_logprobs}, f"top_logprobs={args.top_logprobs}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
