"""The most bytes of input text one token can stand for, read from a `tokenizers` pipeline: then a
text longer than max_model_len x that many bytes can never fit the context, and the server can
refuse it before spending tokenizer time on it.

Sound only when no stage of the pipeline deletes text or folds an unbounded span into one token,
so the answer is None unless every stage is one of those below:
- normalizers that keep the text (Prepend; Replace of a literal by a text at least as long) or
  shrink it by a bounded factor: Unicode composition (NFC/NFKC; Hangul jamo: 9 bytes -> 3) and
  Lowercase (the Kelvin sign, 3 bytes -> `k`, 1): x3 each; Replace of a literal by a shorter one:
  by its ratio. Strip, StripAccents, Bert's and SentencePiece's precompiled normalizers can delete.
- pre-tokenizers that split without removing (ByteLevel, Metaspace, Digits, UnicodeScripts, Split
  and Punctuation unless their behaviour is `Removed`). Whitespace splitters drop the spaces.
- BPE with byte fallback, or without unknown-token fusion (then an unknown character is one token,
  at most 4 bytes); Unigram with byte fallback. WordPiece maps a whole long word to [UNK].
A model-vocabulary token's length is counted in characters under ByteLevel (one character per
byte) and in UTF-8 bytes otherwise (an over-estimate: `▁` is 3 bytes for a space, `<0x41>` 6 for
one byte); an added token matches its own text, in bytes."""
from __future__ import annotations

import json
import math

_COMPOSING = {"NFC", "NFKC", "NFD", "NFKD", "Lowercase"}  # NFD/NFKD only expand; counted as NFC to be safe
_SPLITTERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}


def _normalizer_factor(n: dict | None) -> float | None:
    if n is None:
        return 1.0
    kind = n.get("type")
    if kind == "Sequence":
        factor = 1.0
        for part in n.get("normalizers", []):
            f = _normalizer_factor(part)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "Prepend":
        return 1.0
    if kind in _COMPOSING:
        return 3.0
    if kind == "Replace":
        literal, content = (n.get("pattern") or {}).get("String"), n.get("content") or ""
        if not isinstance(literal, str) or not literal or not content:
            return None  # a regular expression, or a replacement by nothing
        return max(1.0, len(literal.encode()) / len(content.encode()))
    return None


def _keeps_text(p: dict | None) -> bool:
    if p is None:
        return True
    kind = p.get("type")
    if kind == "Sequence":
        return all(_keeps_text(part) for part in p.get("pretokenizers", []))
    if kind in ("Split", "Punctuation"):
        return str(p.get("behavior", "")).lower() != "removed"
    return kind in _SPLITTERS


def _has_byte_level(p: dict | None) -> bool:
    if p is None:
        return False
    if p.get("type") == "Sequence":
        return any(_has_byte_level(part) for part in p.get("pretokenizers", []))
    return p.get("type") == "ByteLevel"


def _model_bounded(m: dict) -> bool:
    kind = m.get("type")
    if kind == "BPE":
        return bool(m.get("byte_fallback")) or not (m.get("fuse_unk") and m.get("unk_token"))
    if kind == "Unigram":
        return bool(m.get("byte_fallback"))
    return False


def max_bytes_per_token(tok) -> int | None:
    """tok: a tokenizers.Tokenizer. None when its pipeline can delete text (see the module doc)."""
    cfg = json.loads(tok.to_str())
    factor = _normalizer_factor(cfg.get("normalizer"))
    pre = cfg.get("pre_tokenizer")
    if factor is None or not _keeps_text(pre) or not _model_bounded(cfg.get("model") or {}):
        return None
    byte_level = _has_byte_level(pre)
    longest = max((len(t) if byte_level else len(t.encode()) for t in tok.get_vocab(with_added_tokens=False)),
                  default=1)
    added = max((len(t.content.encode()) for t in tok.get_added_tokens_decoder().values()), default=1)
    return math.ceil(max(longest, added, 4) * factor)
