"""max_bytes_per_token: for the pipelines it bounds, no text has more UTF-8 bytes than its token
count times the bound (so refusing longer text before tokenizing never refuses a prompt that
fits), including text that normalizers shrink (composition, the Kelvin sign, Hangul jamo); for
pipelines that can delete text or fold a whole span into one token, it gives no bound."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from ridgeline.weights.token_bytes import max_bytes_per_token

from conftest import _byte_tokenizer

TRICKY = ["e\u0301", "\u1100\u1161\u11a8", "\u212a", "\u1e9e", "\uff21", "\ufb03", " ", "  ", "\n", "\u200b",
          "\u0130", "a\u0323\u0302", "\U0001f642", "\u4e2d", "\x00", "\u00e9"]
texts = st.lists(st.sampled_from(TRICKY) | st.text(min_size=1, max_size=8), min_size=1, max_size=40).map("".join)


def spm_like(normalizer=None, pre=None, **model) -> Tokenizer:
    """A SentencePiece-style BPE: `▁` for spaces, byte-fallback tokens <0x00>..<0xFF>."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": b + 1 for b in range(256)}}
    for piece in ("▁", "t", "h", "e", "a", "th", "▁th", "▁the", "he"):
        vocab.setdefault(piece, len(vocab))
    merges = [("t", "h"), ("▁", "th"), ("▁th", "e"), ("h", "e")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", **{"byte_fallback": True, "fuse_unk": True,
                                                                      **model}))
    tok.normalizer = normalizer if normalizer is not None else normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    if pre is not None:
        tok.pre_tokenizer = pre
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


BOUNDED = {
    "byte-level BPE": _byte_tokenizer,
    "sentencepiece byte fallback": spm_like,
    "NFKC + lowercase + metaspace": lambda: spm_like(
        normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]),
        pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Digits(individual_digits=True)])),
}


@pytest.mark.parametrize("name", BOUNDED)
@settings(max_examples=150, deadline=None)
@given(text=texts)
def test_tokens_times_the_bound_cover_every_text(name, text):
    tok = BOUNDED[name]()
    bound = max_bytes_per_token(tok)
    assert bound is not None
    assert len(tok.encode(text, add_special_tokens=False).ids) * bound >= len(text.encode("utf-8"))


def test_the_bound_of_known_pipelines():
    assert max_bytes_per_token(_byte_tokenizer()) == 4  # one byte per token; `</s>` is 4
    assert max_bytes_per_token(spm_like()) == 6  # `<0xE4>`, `▁the`: 6 bytes each, over-estimates (1 and 4)
    assert max_bytes_per_token(BOUNDED["NFKC + lowercase + metaspace"]()) == 6 * 9


@pytest.mark.parametrize("make", [
    lambda: spm_like(pre=pre_tokenizers.Whitespace()),  # drops the spaces
    lambda: spm_like(normalizers.StripAccents()),
    lambda: spm_like(normalizers.Strip()),
    lambda: spm_like(normalizers.Replace(Regex(r"\s+"), " ")),
    lambda: spm_like(normalizers.Replace("ab", "")),
    lambda: spm_like(pre=pre_tokenizers.Split(" ", behavior="removed")),
    lambda: spm_like(byte_fallback=False),  # fused unknown characters: a whole span is one <unk>
    lambda: Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")),
], ids=["whitespace", "strip-accents", "strip", "replace-regex", "replace-by-nothing", "split-removed",
        "fused-unk", "wordpiece"])
def test_pipelines_that_can_delete_text_have_no_bound(make):
    assert max_bytes_per_token(make()) is None
