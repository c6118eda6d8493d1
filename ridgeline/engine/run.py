"""Running a batch of prompts through an LLMEngine to completion: the one loop behind `LLM.generate` /
`LLM.chat` and the tools that drive the engine directly (benchmarks, eval, the advisor's measured
validations, train-draft's data). `start_engine(model, **options)` builds the engine `LLM(model,
**options)` wraps, from the same keyword options."""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from tqdm.auto import tqdm

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.sampling_params import SamplingParams

_ids = itertools.count()  # request ids of runs not given their own: unique in this process


def start_engine(model: str, **options) -> LLMEngine:
    """The engine for `model` with these engine options (EngineConfig.from_kwargs validates them)."""
    return LLMEngine(EngineConfig.from_kwargs(model, **options))


def run_to_completion(engine: LLMEngine, prompts: Sequence[str | list[int]],
                      params: SamplingParams | Sequence[SamplingParams], texts: Sequence[str] | None = None,
                      request_ids: Iterable[str] | None = None, use_tqdm: bool = False,
                      adapters: Sequence[str | None] | None = None) -> list[RequestOutput]:
    """Add every prompt (token ids, or a string the engine encodes), step the engine until each has
    finished, and return their final outputs in prompt order. params: one for all, or one per prompt;
    texts: the prompts' text where they are given as ids (a chat template rendered); request_ids:
    default "run-N"; adapters: per prompt, the LoRA adapter it runs under (registered with the runner's
    deltas) or None. Requests added before one that fails to add, and all of them on an exception while
    stepping (Ctrl-C included), are aborted, so their KV blocks return to the pool."""
    plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    ids = iter(request_ids) if request_ids is not None else (f"run-{next(_ids)}" for _ in itertools.count())
    order: dict[str, int] = {}
    try:
        for i, (prompt, p) in enumerate(zip(prompts, plist, strict=True)):
            rid = next(ids)
            engine.add_request(rid, prompt, p, texts[i] if texts else None,
                               adapter=adapters[i] if adapters else None)
            order[rid] = i
    except Exception:
        for rid in order:
            engine.abort_request(rid)
        raise
    results: list[RequestOutput | None] = [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc="generate", unit="req", disable=not use_tqdm)
    try:
        while any(r is None for r in results):
            for out in engine.step(emit_unfinished=False):
                if out.finished and out.request_id in order:
                    results[order[out.request_id]] = out
                    bar.update(1)
    finally:
        bar.close()
        for rid in order:
            engine.abort_request(rid)  # no-op for finished ones; frees blocks on Ctrl-C
    return results
