"""Incremental detokenization with stop strings; never emits a broken UTF-8 sequence of up to
MAX_PENDING tokens. Work per token is bounded: each add decodes two windows of at most
_LOOKBACK + MAX_PENDING tokens, and the text is kept as final pieces plus a short tail (no copy
of the whole text per token)."""
from __future__ import annotations

from ridgeline.sampling_params import SamplingParams
from ridgeline.weights.tokenizer import Tokenizer

_LOOKBACK = 6  # tokens of context decoded before the new ones, so merges across tokens render
# Tokens held back while their text ends in an incomplete character (or shows nothing yet). Past
# this, they are emitted as decoded, incomplete bytes as U+FFFD (as errors="replace" would), and
# decoding moves on. A character spans at most 4 byte tokens; 8 leaves room for tokens that split
# several characters in a row.
MAX_PENDING = 8


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], params: SamplingParams):
        self.tok = tokenizer
        self.skip = params.skip_special_tokens
        self.stops = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids = list(prompt_ids[-_LOOKBACK:])  # the decode window: [prefix_offset, read_offset) + pending
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self._final: list[str] = []  # text no stop string can cut any more, in pieces
        self._taken = 0  # of _final's pieces, those take() has returned
        self._tail = ""  # the last `hold` characters at most: a stop string may still end in them
        self.stopped_by: str | None = None

    @property
    def text(self) -> str:
        """All the text so far (joined: for tests and callers outside the step loop)."""
        return "".join(self._final) + self._tail

    def add(self, token_id: int) -> bool:
        """Append one token; return True if a stop string finished the text."""
        self.ids.append(token_id)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        pending = len(self.ids) - self.read_offset
        if (len(full) <= len(prefix) or full.endswith("\ufffd")) and pending < MAX_PENDING:
            return False  # incomplete UTF-8 sequence (or nothing visible yet): wait for more tokens
        new = full[len(prefix):]
        # the window slides: what was read becomes the next prefix (ids before it are never decoded again)
        del self.ids[:self.read_offset]
        self.prefix_offset, self.read_offset = 0, len(self.ids)
        self._tail += new
        if self.stops and self._check_stop():
            return True
        tail, hold = self._tail, self.hold
        if len(tail) > hold:  # what no stop string can reach any more becomes final
            self._final.append(tail[:len(tail) - hold])
            self._tail = tail[len(tail) - hold:]
        return False

    def _check_stop(self) -> bool:
        """Search the tail (the held characters and the new ones); cut it at the first stop string."""
        hits = [(i, s) for s in self.stops if (i := self._tail.find(s)) >= 0]
        if not hits:
            return False
        i, s = min(hits)
        self._tail = self._tail[: i + len(s)] if self.include_stop else self._tail[:i]
        self.stopped_by = s
        return True

    def take(self, finished: bool) -> str:
        """The text safe to stream that no earlier take returned: once finished, everything left;
        before, all but what a stop string could still cut."""
        new = "".join(self._final[self._taken:])
        self._taken = len(self._final)
        if finished:
            new += self._tail
            self._final.append(self._tail)
            self._taken += 1
            self._tail = ""
        return new
