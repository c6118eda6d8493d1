"""Offline API, shaped as vLLM users expect: LLM(model, **engine_options).generate(prompts, params)."""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from tqdm.auto import tqdm

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str = "smollm2-135m", **engine_options):
        self.config = EngineConfig.from_kwargs(model, **engine_options)
        self.engine = LLMEngine(self.config)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def info(self):
        return self.engine.info

    def generate(self, prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Prompts: a string, token ids, or a list of either. Returns outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run(list(prompts), sampling_params, None, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True) -> list[RequestOutput]:
        """One conversation (a list of {role, content}) or a list of them."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        texts = [self.tokenizer.apply_chat_template(c) for c in convs]
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return self._run(ids, sampling_params, texts, use_tqdm)

    def _run(self, prompts: list, params, texts: list[str] | None, use_tqdm: bool) -> list[RequestOutput]:
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} sampling params for {len(prompts)} prompts")
        order = {}
        try:
            for i, (prompt, p) in enumerate(zip(prompts, plist)):
                rid = f"gen-{next(self._ids)}"
                self.engine.add_request(rid, prompt, p, texts[i] if texts else None)
                order[rid] = i
        except Exception:
            for rid in order:
                self.engine.abort_request(rid)
            raise
        results: list[RequestOutput | None] = [None] * len(prompts)
        bar = tqdm(total=len(prompts), desc="generate", unit="req", disable=not use_tqdm)
        try:
            while any(r is None for r in results):
                for out in self.engine.step(emit_unfinished=False):
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        bar.update(1)
        finally:
            bar.close()
            for rid in order:
                self.engine.abort_request(rid)  # no-op for finished ones; frees blocks on Ctrl-C
        return results
