"""`python -m ridgeline.distributed.worker`: one follower rank started by rank 0 on this machine. Reads
(EngineConfig, RankContext) on stdin (wire.py's codec: only those types decode), the launch's secret
from its environment, builds its shard of the engine, then runs rank 0's calls until told to stop.
Exits non-zero on any failure (rank 0 then fails its requests and exits too)."""
from __future__ import annotations

import logging
import sys

from ridgeline.config import EngineConfig
from ridgeline.distributed import wire
from ridgeline.distributed.group import RankContext
from ridgeline.distributed.launch import EXIT_RANK_FAILED, watch_parent


def main() -> int:
    config, ctx = wire.decode(sys.stdin.buffer.read())
    if not (isinstance(config, EngineConfig) and isinstance(ctx, RankContext)):
        print("ridgeline: a worker's stdin must hold (EngineConfig, RankContext)", file=sys.stderr)
        return EXIT_RANK_FAILED
    watch_parent()
    logging.basicConfig(level=logging.WARNING, format=f"rank {ctx.rank} %(levelname)s %(name)s: %(message)s")
    from ridgeline.distributed.group import pin
    if ctx.cores:
        pin(ctx.cores)
    try:
        from ridgeline.engine.llm_engine import LLMEngine
        engine = LLMEngine(config, rank=ctx)
        engine.follow()
    except Exception as e:  # noqa: BLE001  any failure ends this rank, loudly
        what = "pipeline stage" if config.parallel.pipeline_parallel_size > 1 else "rank"
        print(f"ridgeline: {what} {ctx.rank} of {ctx.size} failed: {type(e).__name__}: {e}", file=sys.stderr,
              flush=True)
        return EXIT_RANK_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
