"""The shipped public-domain texts (texts/README.md says where they come from): a calibration part for
methods that fit to data and a held-out part that evaluation scores. They never share a paragraph."""
from __future__ import annotations

from functools import cache
from pathlib import Path

TEXTS = Path(__file__).parent / "texts"
PARTS = ("heldout", "calibration")


@cache
def text(part: str = "heldout") -> str:
    if part not in PARTS:
        raise ValueError(f"unknown text part {part!r}; known: {', '.join(PARTS)}")
    return (TEXTS / f"{part}.txt").read_text(encoding="utf-8")


def documents(part: str = "heldout") -> list[str]:
    """The part's profiles, one string each (paragraphs inside separated by a blank line)."""
    return [d.strip() for d in text(part).split("\n\n\n") if d.strip()]


def windows(ids: list[int], length: int, max_tokens: int | None = None) -> list[list[int]]:
    """Consecutive non-overlapping windows of `length` tokens (a shorter tail dropped), at most
    max_tokens tokens in all (None: every full window)."""
    n = len(ids) // length
    if max_tokens:
        n = min(n, max(1, max_tokens // length))
    return [ids[i * length:(i + 1) * length] for i in range(n)]
