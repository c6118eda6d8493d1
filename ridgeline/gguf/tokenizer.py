"""Build a Hugging Face `tokenizers.Tokenizer` from GGUF tokenizer metadata.

Supports `tokenizer.ggml.model` = `gpt2` (byte-level BPE; pre-tokenizer picked from
`tokenizer.ggml.pre` to match how the vocabulary was trained) and `llama` (SentencePiece BPE with
byte fallback). Token types follow llama.cpp: 1 normal, 2 unknown, 3 control, 4 user-defined,
5 unused, 6 byte.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from functools import lru_cache

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ridgeline.errors import ModelLoadError
from ridgeline.gguf.meta import in_file, meta_bool, meta_index, meta_numbers, meta_str, meta_strings

UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4
MAX_SPM_TOKEN = 1024  # characters: finding a SentencePiece vocabulary's merges tries every split of a token

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


def _tokens(metadata: dict) -> list[str]:
    tokens = meta_strings(metadata, "tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelLoadError("GGUF file has no tokenizer (tokenizer.ggml.tokens is missing)")
    return tokens


def _special_id(metadata: dict, name: str, n_tokens: int) -> int | None:
    key = f"tokenizer.ggml.{name}_token_id"
    value = meta_index(metadata, key)
    if value is not None and value >= n_tokens:
        raise ModelLoadError(f"metadata {key} = {value} is past the vocabulary of {n_tokens} tokens")
    return value


def _flag(metadata: dict, key: str, default: bool) -> bool:
    return meta_bool(metadata, f"tokenizer.ggml.{key}", default)


@contextmanager
def _library(what: str):
    """The tokenizers library refuses data it cannot take with plain exceptions: a ModelLoadError here."""
    try:
        yield
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"GGUF tokenizer: cannot build {what}: {e}") from None


def _vocab(tokens: list[str]) -> dict[str, int]:
    # Duplicate spellings keep their first id, as llama.cpp's token -> id map does.
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    return vocab


def _merges(metadata: dict) -> list[tuple[str, str]]:
    merges = meta_strings(metadata, "tokenizer.ggml.merges")
    if merges is None:
        raise ModelLoadError("GGUF gpt2 tokenizer has no tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bad = next((i for i, p in enumerate(pairs) if len(p) != 2), None)
    if bad is not None:
        raise ModelLoadError(f"metadata tokenizer.ggml.merges: entry {bad} {merges[bad][:40]!r} is not "
                             "two tokens separated by a space")
    return pairs


def _gpt2(metadata: dict) -> Tokenizer:
    pre = meta_str(metadata, "tokenizer.ggml.pre") or "default"
    if pre not in _PRE:
        raise ModelLoadError(f"GGUF pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(_PRE))}")
    merges = _merges(metadata)
    tokens = _respell(_tokens(metadata), set(_added_ids(metadata)))
    with _library("the BPE model"):
        bpe = models.BPE(_vocab(tokens), merges, ignore_merges=pre in _IGNORE_MERGES)
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
    tokens = list(_tokens(metadata))
    scores = meta_numbers(metadata, "tokenizer.ggml.scores", len(tokens))
    if scores is None:
        raise ModelLoadError("GGUF llama (SentencePiece) tokenizer has no tokenizer.ggml.scores")
    long = next((i for i, t in enumerate(tokens) if len(t) > MAX_SPM_TOKEN), None)
    if long is not None:
        raise ModelLoadError(f"metadata tokenizer.ggml.tokens: token {long} is {len(tokens[long])} characters "
                             f"long (a SentencePiece vocabulary's tokens are read up to {MAX_SPM_TOKEN})")
    vocab = _vocab(tokens)
    unk = _special_id(metadata, "unknown", len(tokens))
    with _library("the SentencePiece model"):
        bpe = models.BPE(vocab, _spm_merges(tokens, scores, vocab), fuse_unk=True, byte_fallback=True,
                         unk_token=tokens[unk] if unk is not None else None)
    tok = Tokenizer(bpe)
    space_prefix = _flag(metadata, "add_space_prefix", True)
    steps = [normalizers.Replace(" ", "\u2581")]
    if space_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    strip = [decoders.Strip(" ", 1, 0)] if space_prefix else []
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    _add_special(tok, tokens, metadata, byte_level=False)
    return tok


def _added_ids(metadata: dict) -> dict[int, bool]:
    """Ids of tokens matched whole in raw text, as llama.cpp does -> whether they are special
    (control and unknown tokens are; user-defined ones are not)."""
    types = meta_numbers(metadata, "tokenizer.ggml.token_type", len(_tokens(metadata)))
    if types is None:
        return {}
    ids = np.flatnonzero(np.isin(types, (UNKNOWN, CONTROL, USER_DEFINED)))
    return {int(i): bool(types[i] != USER_DEFINED) for i in ids}


def _add_special(tok: Tokenizer, tokens: list[str], metadata: dict, byte_level: bool) -> None:
    with _library("the added tokens"):
        _add_special_tokens(tok, tokens, metadata, byte_level)


def _add_special_tokens(tok: Tokenizer, tokens: list[str], metadata: dict, byte_level: bool) -> None:
    added = _added_ids(metadata)
    tok.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True)
                            for i, special in added.items() if special])
    tok.add_tokens([AddedToken(tokens[i], normalized=False, special=False)
                    for i, special in added.items() if not special])
    bos, eos = _special_id(metadata, "bos", len(tokens)), _special_id(metadata, "eos", len(tokens))
    add_bos = _flag(metadata, "add_bos_token", meta_str(metadata, "tokenizer.ggml.model") == "llama")
    add_eos = _flag(metadata, "add_eos_token", False)
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
    """`metadata` as returned by `reader.read_gguf(path).metadata`."""
    model = meta_str(metadata, "tokenizer.ggml.model")
    _tokens(metadata)
    if model == "gpt2":
        return _gpt2(metadata)
    if model == "llama":
        return _llama_spm(metadata)
    raise ModelLoadError(f"GGUF tokenizer model {model!r} is not supported (supported: gpt2, llama)")


def special_tokens(metadata: dict) -> dict[str, str | None]:
    """bos/eos/unk/pad token strings named in the metadata (None where absent)."""
    tokens = meta_strings(metadata, "tokenizer.ggml.tokens") or []
    out = {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        i = meta_index(metadata, f"tokenizer.ggml.{key}_token_id")
        out[name] = tokens[i] if i is not None and i < len(tokens) else None
    return out


def load_gguf_tokenizer(path) -> Tokenizer:
    from ridgeline.gguf.reader import read_gguf

    g = read_gguf(path)
    try:
        return build_tokenizer(g.metadata)
    except ModelLoadError as e:
        raise in_file(e, path) from None
    finally:
        g.close()
