"""Per-request sampling parameters, validated once at construction (vLLM-shaped)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ridgeline.errors import InvalidRequestError

MAX_LOGPROBS = 20
MAX_N = 128


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param)


def _finite(param: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(param, f"must be a finite number, got {value!r}")
    return float(value)


def _int(param: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(param, f"must be an integer, got {value!r}")
    return value


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per sampled token (0: only the sampled one)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        self.n = _int("n", self.n)
        if not 1 <= self.n <= MAX_N:
            raise _bad("n", f"must be between 1 and {MAX_N}, got {self.n}")
        self.temperature = _finite("temperature", self.temperature)
        if self.temperature < 0:
            raise _bad("temperature", f"must be >= 0, got {self.temperature}")
        self.top_p = _finite("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise _bad("top_p", f"must be in (0, 1], got {self.top_p}")
        self.top_k = _int("top_k", self.top_k)
        if self.top_k < -1:
            raise _bad("top_k", f"must be -1 or 0 (disabled) or a positive integer, got {self.top_k}")
        if self.top_k == -1:
            self.top_k = 0
        self.min_p = _finite("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise _bad("min_p", f"must be in [0, 1], got {self.min_p}")
        self.repetition_penalty = _finite("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise _bad("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = _finite(name, getattr(self, name))
            if not -2 <= value <= 2:
                raise _bad(name, f"must be in [-2, 2], got {value}")
            setattr(self, name, value)
        if self.seed is not None:
            self.seed = _int("seed", self.seed)
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if not all(isinstance(s, str) for s in self.stop):
            raise _bad("stop", "must be a string or a list of strings")
        self.stop = [s for s in self.stop if s]
        self.stop_token_ids = [_int("stop_token_ids", t) for t in (self.stop_token_ids or [])]
        if self.max_tokens is not None:
            self.max_tokens = _int("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise _bad("max_tokens", f"must be >= 1, got {self.max_tokens}")
        self.min_tokens = _int("min_tokens", self.min_tokens)
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise _bad("min_tokens", f"must be in [0, max_tokens], got {self.min_tokens}")
        if self.logprobs is not None:
            self.logprobs = _int("logprobs", self.logprobs)
            if not 0 <= self.logprobs <= MAX_LOGPROBS:
                raise _bad("logprobs", f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
