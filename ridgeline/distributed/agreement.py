"""Every rank of a group must run the same code on the same model with the same engine options. A
torchrun launch starts each rank from its own command line, possibly on another machine, so that is
checked once, right after the rendezvous: ranks that differ (another ridgeline or torch version,
another model, other flags) fail at start-up naming what differs, never later mid-step."""
from __future__ import annotations

import dataclasses

import torch

from ridgeline.distributed.frames import all_gather
from ridgeline.errors import InvalidRequestError
from ridgeline.version import __version__

# options that may differ between ranks: progress bars, where a node keeps the model files, and the
# rendezvous address (the rendezvous itself has already agreed on it)
RANK_LOCAL = frozenset({"progress", "model.model", "parallel.master_addr", "parallel.master_port",
                        "parallel.internal_secret_file"})
SHOWN = 4  # differences named in the error


def _flatten(value, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}{k}.", out)
    else:
        key = prefix[:-1]
        if key not in RANK_LOCAL:
            out[key] = repr(value)


def fingerprint(config, arch) -> dict[str, str]:
    """What must be equal on every rank: versions, the engine options and the model's architecture."""
    out = {"ridgeline version": __version__, "torch version": torch.__version__}
    _flatten(dataclasses.asdict(config), "", out)
    if arch is not None:
        _flatten(dataclasses.asdict(arch), "architecture.", out)
    return out


def differences(prints: list[dict[str, str]]) -> list[str]:
    """Each rank's entries that are not rank 0's, as 'rank r: key = value (rank 0: value)'."""
    base, found = prints[0], []
    for r, p in enumerate(prints[1:], start=1):
        for key in sorted(set(base) | set(p)):
            if base.get(key) != p.get(key):
                found.append(f"rank {r}: {key} = {p.get(key, '(absent)')} (rank 0: {base.get(key, '(absent)')})")
    return found


def check_agreement(config, arch, size: int) -> None:
    """Collective: every rank calls it after joining; every rank raises if any two disagree."""
    prints = all_gather(fingerprint(config, arch))
    if not all(isinstance(p, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in p.items())
               for p in prints):
        raise InvalidRequestError("a rank sent a fingerprint that is not a table of strings", "parallel")
    found = differences(prints)
    if found:
        more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise InvalidRequestError(f"the {size} ranks of this launch disagree: {'; '.join(found[:SHOWN])}{more}. Start "
                                  "every rank with the same ridgeline and torch versions, model and options",
                                  "parallel")
