"""The llguidance constraint backend. llguidance compiles JSON schemas, regexes, choices and Lark or
GBNF grammars against the tokenizer's token table, and computes each step's allowed-token bitmask
from an Earley parser over a lazy lexer; every step's work is bounded by its own limits (lexer fuel,
Earley items), so a pathological grammar costs a bounded time per mask, and its compile is refused
when it runs past the limits. Nothing is fetched: a remote `$ref` is an error.

With a timeout (the server's compiles), a grammar not in the cache is compiled first in a niced child
process that is killed at the deadline (structured/compile_worker.py), then in this process.
Compiled grammars are cached by (kind, text) per backend (one backend per engine, so per tokenizer):
each request gets a copy of the cached matcher at its start state. JSON is compact: no whitespace
between tokens (`{"a":1,"b":[2,3]}`), so output stays short and a schema's bounds fit max_tokens."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

import llguidance as llg

from ridgeline.engine.constraint import Constraint, ConstraintBackend, register_constraint_backend
from ridgeline.errors import InvalidRequestError
from ridgeline.structured.compile_worker import START_TIMEOUT_S, CompileTimeout, CompileWorker
from ridgeline.structured.llg_grammar import grammar_of, limits
from ridgeline.structured_params import StructuredOutputs

CACHE_SIZE = 128  # compiled grammars kept per engine
MAX_ERROR_CHARS = 400


class Refused(str):
    """A compile error, cached as its text: each request's error names its own field."""


def _refused(spec: StructuredOutputs, error: str) -> InvalidRequestError:
    error = " ".join(error.split())
    if len(error) > MAX_ERROR_CHARS:
        error = error[:MAX_ERROR_CHARS - 3] + "..."
    return InvalidRequestError(f"{spec.field}: this {spec.kind.replace('_', ' ')} cannot be enforced: {error}",
                               spec.field, code="unsupported_parameter")


class LLGConstraint(Constraint):
    def __init__(self, matcher: llg.LLMatcher, mask_bytes: int):
        self.m = matcher
        self.mask_bytes = mask_bytes

    def allowed_mask(self) -> bytes:
        return self.m.compute_bitmask()[:self.mask_bytes]

    def advance(self, token: int) -> bool:
        return self.m.consume_token(token) and not self.m.is_error()

    def rollback(self, n: int) -> None:
        if n and not self.m.rollback(n):
            raise RuntimeError(f"the matcher could not roll back {n} tokens: {self.m.get_error()}")

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        return self.m.validate_tokens(list(tokens)) if tokens else 0

    def forced_tokens(self) -> list[int]:
        return [] if self.m.is_stopped() else self.m.compute_ff_tokens()

    @property
    def accepts_eos(self) -> bool:
        return self.m.is_accepting()

    @property
    def is_done(self) -> bool:
        return self.m.is_stopped()


@register_constraint_backend("llguidance")
class LLGBackend(ConstraintBackend):
    def __init__(self, tokenizer, vocab_size: int, eos_ids: Sequence[int]):
        super().__init__(tokenizer, vocab_size, eos_ids)
        self._lock = threading.Lock()
        self._tok: llg.LLTokenizer | None = None
        self._cache: OrderedDict[tuple[str, str], llg.LLMatcher | Refused] = OrderedDict()
        self.mask_bytes = (vocab_size + 31) // 32 * 4
        self._compile_worker: CompileWorker | None = None  # the server's compiles try there first

    def _tokenizer(self) -> llg.LLTokenizer:
        with self._lock:
            if self._tok is None:  # about a second for a large vocabulary: once per engine
                n = max(self.vocab_size, self.tokenizer.vocab_size)
                self._tok = llg.LLTokenizer(self.tokenizer.to_json(), n_vocab=n, eos_token=list(self.eos_ids))
            return self._tok

    def _compiled(self, spec: StructuredOutputs, timeout: float | None = None) -> llg.LLMatcher:
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None and timeout is not None:  # tried first in the worker process, which can be killed
            try:
                error = self._worker().check(*key, timeout)
            except CompileTimeout:
                raise InvalidRequestError(f"{spec.field}: compiling it took over {timeout:g} s; simplify it",
                                          spec.field, code="unsupported_parameter") from None
            if error is not None:
                hit = Refused(error)
        if hit is None:
            hit = self._compile(spec)
            with self._lock:
                self._cache[key] = hit
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        if isinstance(hit, Refused):
            raise _refused(spec, hit)
        return hit

    def _compile(self, spec: StructuredOutputs) -> llg.LLMatcher | Refused:
        """Outside the lock: llguidance drops the GIL while it builds, bounded by its limits."""
        tok = self._tokenizer()
        t0 = time.perf_counter()
        try:
            grammar = grammar_of(spec)
            m = llg.LLMatcher(tok, grammar, log_level=0, limits=limits())
            return Refused(m.get_error()) if m.is_error() else m
        except ValueError as e:
            return Refused(str(e))
        finally:
            with self._lock:
                self.compiles += 1
                self.compile_seconds += time.perf_counter() - t0

    def _worker(self) -> CompileWorker:
        with self._lock:
            if self._compile_worker is None:
                n = max(self.vocab_size, self.tokenizer.vocab_size)
                self._compile_worker = CompileWorker(self.tokenizer.to_json(), n, list(self.eos_ids))
            return self._compile_worker

    def load(self, isolated: bool = False) -> None:
        self._tokenizer()
        if isolated:  # start the worker now: its start is not counted in a compile's deadline
            self._worker().check("json_object", "", START_TIMEOUT_S)

    def prepare(self, spec: StructuredOutputs, timeout: float | None = None) -> None:
        self._compiled(spec, timeout)

    def create(self, spec: StructuredOutputs) -> LLGConstraint:
        return LLGConstraint(self._compiled(spec).deep_copy(), self.mask_bytes)
