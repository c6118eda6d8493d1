"""The constraint seam: what the core asks of structured outputs. A request whose SamplingParams
carry `structured` gets one Constraint per choice (each of n has its own state); the engine keeps it
in step with the request's verified tokens, and before each sampling step asks it for a mask row per
position the step samples (for a request verifying k proposals, k + 1 rows: row j after proposals
1..j, consumed and rolled back). The runner sets every token a row forbids to -inf before bias,
penalties, temperature and top-k/top-p/min-p (runner/step_sampler.py). Torch-free.

Backends are a registry keyed by name, as proposers are (engine/proposal.py): the built-in one
(ridgeline/structured/, on llguidance) is named here by module and imported on first use; the core
never imports it. A backend is built once per engine from the tokenizer; `create(spec)` compiles
(cached by spec and tokenizer) and returns a fresh Constraint, raising InvalidRequestError for
anything it cannot enforce exactly. `prepare(spec)` compiles into the cache only: thread-safe, so a
server calls it off its event loop and off the step thread before adding the request."""
from __future__ import annotations

import importlib
from collections.abc import Sequence

from ridgeline.errors import InvalidRequestError
from ridgeline.structured_params import StructuredOutputs

BACKENDS: dict[str, type[ConstraintBackend]] = {}
_BUILTIN = {"llguidance": "ridgeline.structured.llg"}
DEFAULT_BACKEND = "llguidance"


class Constraint:
    """One choice's matcher state: the tokens it consumed are the request's output tokens."""

    def allowed_mask(self) -> bytes:
        """ceil(V / 32) little-endian int32 words: bit t % 32 of word t // 32 set iff token t may follow
        (the EOS ids only where the output so far is complete)."""
        raise NotImplementedError

    def advance(self, token: int) -> bool:
        """Consume a sampled token; False if the constraint forbids it (the request is then ended)."""
        raise NotImplementedError

    def rollback(self, n: int) -> None:
        """Undo the last n advance() calls."""
        raise NotImplementedError

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of tokens, in order, the constraint allows from here (state unchanged)."""
        raise NotImplementedError

    def forced_tokens(self) -> list[int]:
        """The tokens the constraint forces next from here, in order (the fixed text that must follow:
        a key, a brace, the rest of an enum value), each allowed where it stands; [] where the next
        token is a choice. State unchanged. What the `grammar` proposer drafts."""
        return []

    @property
    def accepts_eos(self) -> bool:
        """The output so far is complete: it may end here."""
        raise NotImplementedError

    @property
    def is_done(self) -> bool:
        """Complete, and nothing may follow: the request finishes (finish_reason stop)."""
        raise NotImplementedError


class ConstraintBackend:
    name = "?"

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Sequence[int]):
        """tokenizer: the engine's weights.tokenizer.Tokenizer; vocab_size: the model's (mask width)."""
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, tuple(eos_ids)
        self.compiles = 0  # grammars compiled (cache misses), and the seconds they took: for /metrics
        self.compile_seconds = 0.0

    def load(self, isolated: bool = False) -> None:
        """Build what every compile needs (a token table): idempotent, any thread; slow only once.
        isolated: also start whatever prepare(timeout=...) compiles in (a worker process)."""

    def prepare(self, spec: StructuredOutputs, timeout: float | None = None) -> None:
        """Compile spec into the cache (any thread). Raises InvalidRequestError naming what is refused,
        and, with a timeout, for a compile that would take longer (stopped where the backend can stop
        it: llguidance's runs first in a child process killed at the deadline)."""
        raise NotImplementedError

    def create(self, spec: StructuredOutputs) -> Constraint:
        """A fresh Constraint at the start of spec (compiling it unless cached)."""
        raise NotImplementedError


def register_constraint_backend(name: str):
    def deco(cls):
        cls.name = name
        BACKENDS[name] = cls
        return cls
    return deco


def create_backend(tokenizer, vocab_size: int, eos_ids: Sequence[int],
                   name: str = DEFAULT_BACKEND) -> ConstraintBackend:
    if name in _BUILTIN and name not in BACKENDS:
        try:
            importlib.import_module(_BUILTIN[name])  # registers it
        except ImportError as e:
            raise InvalidRequestError(f"structured outputs need the {name} package ({e})", "structured_outputs")
    cls = BACKENDS.get(name)
    if cls is None:
        raise InvalidRequestError(f"unknown structured-output backend {name!r}; known: "
                                  f"{', '.join(sorted({*BACKENDS, *_BUILTIN}))}", "structured_outputs")
    return cls(tokenizer, vocab_size, eos_ids)


def mask_rows(constraint: Constraint, proposals: Sequence[int]) -> list[bytes]:
    """The mask rows of a step that samples after the known tokens and verifies `proposals` (already
    cut to what the constraint allows): row 0 from here, row j after proposals[:j]. State unchanged."""
    rows = [constraint.allowed_mask()]
    for j, t in enumerate(proposals):
        if not constraint.advance(t):
            constraint.rollback(j)
            raise RuntimeError("a proposal the constraint allowed was refused")
        rows.append(constraint.allowed_mask())
    if proposals:
        constraint.rollback(len(proposals))
    return rows
