"""Offline API, shaped as vLLM users expect: LLM(model, **engine_options).generate(prompts, params)."""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.engine.run import run_to_completion
from ridgeline.errors import InvalidRequestError
from ridgeline.inputs import chat_messages, prompt_list
from ridgeline.sampling_params import SamplingParams


class LLM:
    """Also a context manager: `with LLM(...) as llm:` closes it on the way out. An LLM that is never
    closed releases its ranks (and this process's CPU pin) when it is collected, or at exit."""

    def __init__(self, model: str = "smollm2-135m", **engine_options):
        self.config = EngineConfig.from_kwargs(model, **engine_options)
        if self.config.lora.enable_lora:
            from ridgeline.lora import attach
            attach.check_options(self.config)
        self.engine = LLMEngine(self.config)
        self.lora = None  # the adapter manager (ridgeline/lora/manager.py) with enable_lora
        if self.config.lora.enable_lora:
            self.lora = attach.attach(self.engine)
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the engine's other ranks (tensor, pipeline or expert parallel) and leave their group;
        nothing to do in one process. Idempotent."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def info(self):
        return self.engine.info

    def generate(self, prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora_request=None) -> list[RequestOutput]:
        """Prompts: a string, token ids, or a list of either. Returns outputs in prompt order.
        Special-token text in a string prompt is parsed (a raw prompt may hand-build a template).
        lora_request: a LoRARequest for every prompt, or a list of them (None entries: the base model),
        with LLM(..., enable_lora=True)."""
        return self._run(prompt_list(prompts), sampling_params, None, use_tqdm, lora_request)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, lora_request=None) -> list[RequestOutput]:
        """One conversation (a list of {role, content}) or a list of them. Content is a string or a
        list of {"type": "text", "text": ...} parts, as on the server; special-token text inside it
        stays plain text."""
        if isinstance(messages, (list, tuple)) and messages and all(isinstance(c, (list, tuple)) for c in messages):
            convs = [chat_messages(c, f"messages.{i}") for i, c in enumerate(messages)]
        else:
            convs = [chat_messages(messages)]
        texts = [self.tokenizer.apply_chat_template(c) for c in convs]
        ids = [self.tokenizer.encode_chat(c, rendered=t) for c, t in zip(convs, texts)]
        return self._run(ids, sampling_params, texts, use_tqdm, lora_request)

    def _adapters(self, lora_request, n: int) -> list[str | None] | None:
        """Each prompt's adapter name (registered, read and checked on first use), or None for no adapters."""
        if lora_request is None:
            return None
        from ridgeline.lora import LoRARequest
        reqs = list(lora_request) if isinstance(lora_request, (list, tuple)) else [lora_request] * n
        if len(reqs) != n:
            raise InvalidRequestError(f"lora_request: {len(reqs)} given for {n} prompts", "lora_request")
        if any(r is not None and not isinstance(r, LoRARequest) for r in reqs):
            raise InvalidRequestError("lora_request: a LoRARequest, a list of them (None: the base model), or None",
                                      "lora_request")
        if self.lora is None and any(r is not None for r in reqs):
            raise InvalidRequestError("lora_request needs LLM(..., enable_lora=True)", "lora_request")
        return [None if r is None else self.lora.register(r) for r in reqs]

    def _run(self, prompts: list, params, texts: list[str] | None, use_tqdm: bool,
             lora_request=None) -> list[RequestOutput]:
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequestError(f"sampling_params: {len(plist)} given for {len(prompts)} prompts",
                                      "sampling_params")
        for p in plist:
            if not isinstance(p, SamplingParams):
                raise InvalidRequestError(f"sampling_params: must be a SamplingParams or a list of them, not "
                                          f"{type(p).__name__}", "sampling_params")
        adapters = self._adapters(lora_request, len(prompts))
        ids = (f"gen-{next(self._ids)}" for _ in plist)
        return run_to_completion(self.engine, prompts, plist, texts, ids, use_tqdm, adapters)
