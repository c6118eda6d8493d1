"""Per-request sampling parameters, vLLM-shaped, validated once at construction and frozen after.

Every value is checked against what the engine can hold (integers that reach an int64 tensor or
torch's generator stay in the signed 64-bit range; floats stay finite in float32), so nothing
invalid reaches a step. Copies with changes: `dataclasses.replace(params, n=2)` (re-validated).
"""
from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from ridgeline.errors import InvalidRequestError
from ridgeline.inputs import check_text
from ridgeline.structured_params import StructuredOutputs

MAX_LOGPROBS = 20
MAX_N = 128
MAX_STOP_STRINGS = 64  # stop strings per request; each is searched for after every visible token
MAX_STOP_STRING_CHARS = 256  # longest stop string: streamed text is held back by up to this many characters
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # entries: applied every step, so bounded like the stop lists
LOGIT_BIAS_RANGE = 100.0  # OpenAI's range: a bias in [-100, 100] is added to the token's logit
GREEDY_EPSILON = 1e-5  # temperatures below this are greedy (1e-300 would underflow float32 to 0)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param)


def _f32(value: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # some Python versions refuse to round past float32's range
        return math.copysign(math.inf, value)


def _float(param: str, value) -> float:
    """A number that stays finite in float32 (the sampler's dtype)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(param, f"must be a number, got {_shown(value)}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(_f32(value)):
        raise _bad(param, f"must be a finite number within float32's range, got {_shown(value)}")
    return value


def _int(param: str, value, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """An integer in [lo, hi]; the defaults are the signed 64-bit range (it reaches int64 tensors)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(param, f"must be an integer, got {_shown(value)}")
    if not lo <= value <= hi:
        if hi != INT64_MAX:
            bounds = f"in [{lo}, {hi}]"
        elif lo != INT64_MIN:
            bounds = f">= {lo} and fit in a signed 64-bit integer"
        else:
            bounds = "a signed 64-bit integer"
        raise _bad(param, f"must be {bounds}, got {_shown(value)}")
    return int(value)


def _bool(param: str, value) -> bool:
    if not isinstance(value, bool):
        raise _bad(param, f"must be true or false, got {_shown(value)}")
    return value


def _shown(value) -> str:
    if isinstance(value, int) and value.bit_length() > 128:  # str() refuses ints past 4300 digits
        return f"an integer of {value.bit_length()} bits"
    text = ascii(value)  # ascii: a lone surrogate or a newline cannot reach a log or a JSON body raw
    return text if len(text) <= 40 else text[:37] + "..."


def _items(param: str, value, kinds: type | tuple[type, ...]) -> tuple:
    """A list or tuple (or a single kinds value) -> tuple; never iterates a str, bytes or a number."""
    if isinstance(value, kinds):
        return (value,)
    if not isinstance(value, (list, tuple)):
        raise _bad(param, f"must be a list, got {_shown(value)}")
    return tuple(value)


def _stops(value) -> tuple[str, ...]:
    stops = _items("stop", value, str)
    if len(stops) > MAX_STOP_STRINGS:
        raise _bad("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
    for s in stops:
        if not isinstance(s, str):
            raise _bad("stop", f"must be a string or a list of strings, got an item {_shown(s)}")
        if len(s) > MAX_STOP_STRING_CHARS:
            raise _bad("stop", f"each stop string is at most {MAX_STOP_STRING_CHARS} characters, got {len(s)}")
    check_text(stops, "stop")
    return tuple(dict.fromkeys(s for s in stops if s))


def _logit_bias(value) -> tuple[tuple[int, float], ...]:
    """{token id: bias} (or the stored (id, bias) pairs, as dataclasses.replace passes them)."""
    if isinstance(value, Mapping):
        pairs = tuple(value.items())
    elif isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        pairs = value
    else:
        raise _bad("logit_bias", f"must map token ids to biases, got {_shown(value)}")
    if len(pairs) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"at most {MAX_LOGIT_BIAS} entries, got {len(pairs)}")
    out = {}
    for token, bias in pairs:
        token = _int("logit_bias", token, 0)
        bias = _float("logit_bias", bias)
        if not -LOGIT_BIAS_RANGE <= bias <= LOGIT_BIAS_RANGE:
            raise _bad("logit_bias", f"biases must be in [-100, 100], got {bias} for token {token}")
        out[token] = bias
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # below GREEDY_EPSILON: greedy
    top_p: float = 1.0  # 0: greedy (a nucleus of one token)
    top_k: int = 0  # 0 or -1: disabled; at least the vocabulary: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # choice i is seeded with seed + i: both in the signed 64-bit range
    stop: tuple[str, ...] | list[str] | str | None = None  # stored as a tuple, empty strings dropped
    stop_token_ids: tuple[int, ...] | list[int] | None = None  # stored as a tuple
    max_tokens: int | None = 16  # None: up to max_model_len; 0 only with prompt_logprobs (score the prompt)
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per sampled token (0: only the sampled one)
    prompt_logprobs: int | None = None  # top-N logprobs per prompt token (its whole prompt is computed)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: Mapping[int, float] | tuple[tuple[int, float], ...] | None = None  # stored as sorted (id, bias) pairs
    best_of: int | None = None  # only None or n: returning the best of more choices is not supported
    # the output must match this (a JSON schema, a regex, a choice, a grammar): every token is drawn from
    # the tokens it allows, and the request stops when it is complete (engine/constraint.py)
    structured: StructuredOutputs | None = None

    def __post_init__(self) -> None:
        for name, value in self._validated().items():
            object.__setattr__(self, name, value)  # frozen: only construction writes fields

    def _validated(self) -> dict:
        v = {"n": _int("n", self.n, 1, MAX_N)}
        v["temperature"] = _float("temperature", self.temperature)
        if v["temperature"] < 0:
            raise _bad("temperature", f"must be >= 0, got {v['temperature']}")
        v["top_p"] = _float("top_p", self.top_p)
        if not 0 <= v["top_p"] <= 1:
            raise _bad("top_p", f"must be in [0, 1], got {v['top_p']}")
        top_k = _int("top_k", self.top_k, -1)
        v["top_k"] = 0 if top_k == -1 else top_k
        v["min_p"] = _float("min_p", self.min_p)
        if not 0 <= v["min_p"] <= 1:
            raise _bad("min_p", f"must be in [0, 1], got {v['min_p']}")
        v["repetition_penalty"] = _float("repetition_penalty", self.repetition_penalty)
        if not _f32(v["repetition_penalty"]) > 0:
            raise _bad("repetition_penalty", f"must be > 0, got {v['repetition_penalty']}")
        for name in ("presence_penalty", "frequency_penalty"):
            v[name] = _float(name, getattr(self, name))
            if not -2 <= v[name] <= 2:
                raise _bad(name, f"must be in [-2, 2], got {v[name]}")
        if self.seed is not None:
            v["seed"] = _int("seed", self.seed)
            if v["seed"] + v["n"] - 1 > INT64_MAX:
                raise _bad("seed", f"choice i is seeded with seed + i: seed + n - 1 must be <= {INT64_MAX}")
        v["stop"] = () if self.stop is None else _stops(self.stop)
        ids = _items("stop_token_ids", () if self.stop_token_ids is None else self.stop_token_ids, int)
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise _bad("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} token ids, got {len(ids)}")
        v["stop_token_ids"] = tuple(_int("stop_token_ids", t, 0) for t in ids)
        if self.prompt_logprobs is not None:
            v["prompt_logprobs"] = _int("prompt_logprobs", self.prompt_logprobs, 0, MAX_LOGPROBS)
        if self.max_tokens is not None:
            v["max_tokens"] = _int("max_tokens", self.max_tokens, 0 if self.prompt_logprobs is not None else 1)
        v["min_tokens"] = _int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and v["min_tokens"] > v["max_tokens"]:
            raise _bad("min_tokens", f"must be in [0, max_tokens], got {v['min_tokens']}")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            v[name] = _bool(name, getattr(self, name))
        if self.logprobs is not None:
            v["logprobs"] = _int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        v["logit_bias"] = () if self.logit_bias is None else _logit_bias(self.logit_bias)
        if self.best_of is not None and _int("best_of", self.best_of, 1) != v["n"]:
            raise InvalidRequestError("best_of: not supported (only best_of == n); ask for n choices instead",
                                      param="best_of", code="unsupported_parameter")
        if self.structured is not None and not isinstance(self.structured, StructuredOutputs):
            raise _bad("structured", f"must be a StructuredOutputs, got {type(self.structured).__name__}")
        return v

    @cached_property
    def logit_bias_columns(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """logit_bias as (token ids, biases), built once for the sampler."""
        return tuple(t for t, _ in self.logit_bias), tuple(b for _, b in self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON or self.top_k == 1 or self.top_p == 0

    @cached_property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that moves the argmax or asks for more than the token: no penalties,
        logit bias, min_tokens bans, structured outputs or logprobs (the step sampler then takes the argmax
        directly)."""
        return self.masked_argmax and self.structured is None

    @cached_property
    def masked_argmax(self) -> bool:
        """As plain_greedy, structured outputs allowed: the token is the argmax over what the mask allows."""
        return (self.greedy and self.repetition_penalty == 1.0 and not self.presence_penalty
                and not self.frequency_penalty and not self.logit_bias and self.min_tokens == 0
                and self.logprobs is None)
