"""Build a Hugging Face `tokenizers.Tokenizer` from GGUF tokenizer metadata.

Supports `tokenizer.ggml.model` = `gpt2` (byte-level BPE; pre-tokenizer picked from
`tokenizer.ggml.pre` to match how the vocabulary was trained) and `llama` (SentencePiece BPE with
byte fallback). Token types follow llama.cpp: 1 normal, 2 unknown, 3 control, 4 user-defined,
5 unused, 6 byte.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ridgeline.errors import ModelLoadError

UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
          rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> (kind, split regex or None). Groups follow llama.cpp's pre-tokenizer table.
_PRE = {
    **{k: ("gpt2", None) for k in ("gpt2", "default", "mpt", "olmo", "jais")},
    **{k: ("digits", None) for k in ("smollm", "starcoder", "refact", "command-r", "codeshell",
                                     "exaone", "minerva")},
    **{k: ("split", _LLAMA3) for k in ("llama-bpe", "llama3", "llama-v3", "falcon3", "dbrx",
                                       "smaug-bpe")},
    **{k: ("split", _QWEN2) for k in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez")},
    **{k: ("split", _GPT4O) for k in ("gpt-4o", "llama4")},
    "tekken": ("split", _TEKKEN),
}
# llama.cpp (and Llama 3's tokenizer.json) take a pre-token whole when it is in the vocabulary.
_IGNORE_MERGES = {"llama-bpe", "llama3", "llama-v3", "falcon3", "dbrx", "smaug-bpe"}


@lru_cache(maxsize=1)
def _byte_alphabet() -> tuple[dict[int, str], re.Pattern]:
    # GPT-2's byte -> printable-unicode table: printable bytes map to themselves, the rest to 256+.
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    outside = re.compile("[^" + re.escape("".join(table.values())) + "]")
    return table, outside


def _respell(tokens: list[str], keep: set[int]) -> list[str]:
    """Byte-level vocabularies are spelled in the byte alphabet; re-spell raw tokens, except the
    added ones in `keep`, which are matched as raw text."""
    table, outside = _byte_alphabet()
    return [t if i in keep or not outside.search(t) else "".join(table[b] for b in t.encode("utf-8"))
            for i, t in enumerate(tokens)]


def _meta(metadata: dict, key: str, default=None):
    return metadata.get(f"tokenizer.ggml.{key}", default)


def _special_id(metadata: dict, name: str) -> int | None:
    value = _meta(metadata, f"{name}_token_id")
    return None if value is None else int(value)


def _vocab(tokens: list[str]) -> dict[str, int]:
    # Duplicate spellings keep their first id, as llama.cpp's token -> id map does.
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    return vocab


def _gpt2(metadata: dict) -> Tokenizer:
    pre = _meta(metadata, "pre") or "default"
    if pre not in _PRE:
        raise ModelLoadError(f"GGUF pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(_PRE))}")
    merges = _meta(metadata, "merges")
    if merges is None:
        raise ModelLoadError("GGUF gpt2 tokenizer has no tokenizer.ggml.merges")
    tokens = _respell(_meta(metadata, "tokens"), set(_added_ids(metadata)))
    bpe = models.BPE(_vocab(tokens), [tuple(m.split(" ", 1)) for m in merges],
                     ignore_merges=pre in _IGNORE_MERGES)
    tok = Tokenizer(bpe)
    kind, split = _PRE[pre]
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif kind == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()  # Qwen2's own tokenizer.json normalizes to NFC
    tok.decoder = decoders.ByteLevel()
    _add_special(tok, tokens, metadata, byte_level=True)
    return tok


def _spm_merges(tokens: list[str], scores, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Merges implied by a scored SentencePiece vocabulary: every split of a token into two
    vocabulary pieces, ranked by the merged token's score (best first), then by piece ids."""
    found = []
    for token, merged_id in vocab.items():
        for i in range(1, len(token)):
            left, right = vocab.get(token[:i]), vocab.get(token[i:])
            if left is not None and right is not None:
                found.append((-float(scores[merged_id]), left, right))
    found.sort()
    return [(tokens[left], tokens[right]) for _, left, right in found]


def _llama_spm(metadata: dict) -> Tokenizer:
    tokens = list(_meta(metadata, "tokens"))
    scores = _meta(metadata, "scores")
    if scores is None:
        raise ModelLoadError("GGUF llama (SentencePiece) tokenizer has no tokenizer.ggml.scores")
    vocab = _vocab(tokens)
    unk = _special_id(metadata, "unknown")
    bpe = models.BPE(vocab, _spm_merges(tokens, scores, vocab), fuse_unk=True, byte_fallback=True,
                     unk_token=tokens[unk] if unk is not None else None)
    tok = Tokenizer(bpe)
    steps = [normalizers.Replace(" ", "\u2581")]
    if _meta(metadata, "add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    strip = [decoders.Strip(" ", 1, 0)] if _meta(metadata, "add_space_prefix", True) else []
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    _add_special(tok, tokens, metadata, byte_level=False)
    return tok


def _added_ids(metadata: dict) -> dict[int, bool]:
    """Ids of tokens matched whole in raw text, as llama.cpp does -> whether they are special
    (control and unknown tokens are; user-defined ones are not)."""
    types = _meta(metadata, "token_type")
    if types is None:
        return {}
    types = np.asarray(types)
    ids = np.flatnonzero(np.isin(types, (UNKNOWN, CONTROL, USER_DEFINED)))
    return {int(i): bool(types[i] != USER_DEFINED) for i in ids}


def _add_special(tok: Tokenizer, tokens: list[str], metadata: dict, byte_level: bool) -> None:
    added = _added_ids(metadata)
    tok.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True)
                            for i, special in added.items() if special])
    tok.add_tokens([AddedToken(tokens[i], normalized=False, special=False)
                    for i, special in added.items() if not special])
    bos, eos = _special_id(metadata, "bos"), _special_id(metadata, "eos")
    add_bos = bool(_meta(metadata, "add_bos_token", _meta(metadata, "model") == "llama"))
    add_eos = bool(_meta(metadata, "add_eos_token", False))
    pieces, specials = ["$A:0"], []
    if add_bos and bos is not None:
        pieces.insert(0, f"{tokens[bos]}:0")
        specials.append((tokens[bos], bos))
    if add_eos and eos is not None:
        pieces.append(f"{tokens[eos]}:0")
        specials.append((tokens[eos], eos))
    if specials:
        single = " ".join(pieces)
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=f"{single} {single.replace('$A', '$B').replace(':0', ':1')}", special_tokens=specials)
    elif byte_level:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)


def build_tokenizer(metadata: dict) -> Tokenizer:
    """`metadata` as returned by `gguf_dequant.read_gguf(path).metadata`."""
    model = _meta(metadata, "model")
    if _meta(metadata, "tokens") is None:
        raise ModelLoadError("GGUF file has no tokenizer (tokenizer.ggml.tokens is missing)")
    if model == "gpt2":
        return _gpt2(metadata)
    if model == "llama":
        return _llama_spm(metadata)
    raise ModelLoadError(f"GGUF tokenizer model {model!r} is not supported (supported: gpt2, llama)")


def special_tokens(metadata: dict) -> dict[str, str | None]:
    """bos/eos/unk/pad token strings named in the metadata (None where absent)."""
    tokens = _meta(metadata, "tokens") or []
    out = {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        i = _special_id(metadata, key)
        out[name] = tokens[i] if i is not None and 0 <= i < len(tokens) else None
    return out


def load_gguf_tokenizer(path) -> Tokenizer:
    from ridgeline.weights.gguf_dequant import read_gguf

    return build_tokenizer(read_gguf(path).metadata)
