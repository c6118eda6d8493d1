"""Incremental detokenization with stop strings; never emits a broken UTF-8 sequence."""
from __future__ import annotations

from ridgeline.sampling_params import SamplingParams
from ridgeline.weights.tokenizer import Tokenizer

_LOOKBACK = 6  # tokens of context decoded before the new ones, so merges across tokens render


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], params: SamplingParams):
        self.tok = tokenizer
        self.skip = params.skip_special_tokens
        self.stops = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids = list(prompt_ids[-_LOOKBACK:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.stopped_by: str | None = None

    def add(self, token_id: int) -> bool:
        """Append one token; return True if a stop string finished the text."""
        self.ids.append(token_id)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False  # incomplete UTF-8 sequence (or nothing visible yet): wait for more tokens
        new = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        start = max(0, len(self.text) - self.hold)
        self.text += new
        return bool(self.stops) and self._check_stop(start)

    def _check_stop(self, start: int) -> bool:
        hits = [(i, s) for s in self.stops if (i := self.text.find(s, start)) >= 0]
        if not hits:
            return False
        i, s = min(hits)
        self.text = self.text[: i + len(s)] if self.include_stop else self.text[:i]
        self.stopped_by = s
        return True

    def emittable(self, finished: bool) -> str:
        """Text safe to stream: all of it once finished, else minus a possible stop-string prefix."""
        if finished or not self.hold:
            return self.text
        return self.text[: max(0, len(self.text) - self.hold)]
