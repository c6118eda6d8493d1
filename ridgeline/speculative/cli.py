"""`ridgeline train-draft MODEL --out DIR --data SRC [--data SRC ...] --tokens N --seed S`: train an
EAGLE-style draft head for MODEL on this machine's CPU and save it as a folder for
`--speculative-method eagle --draft-model DIR`. Data sources, each up to N tokens: `replies`, the
model's own sampled replies to the shipped prompt seeds (speculative/train_data.py; closest to what it will
draft for, but each token costs a decode step); `tasks:FILE`, its sampled replies to document
tasks over FILE's paragraphs (summarize, list, explain, follow-ups: replies that quote and rework a
given text, as chat traffic does); `text:FILE` and `chat:FILE`, the model's hidden
states teacher-forced over fixed text, plain or as chat turns (speculative/train_text.py; one prefill per
chunk). FILE `calibration` is the bundled public-domain text."""
from __future__ import annotations

import argparse
from pathlib import Path

from ridgeline.cli_parser import non_negative_int, positive_int


def register(subparsers, command: str | None = None) -> None:
    p = subparsers.add_parser(
        "train-draft", help="train an EAGLE-style draft head for a model on its own replies or its hidden states over text",
        description=__doc__ + "\nPrompts: the shipped public-domain seeds (every template x topic in "
                              "ridgeline/speculative/prompts/), shuffled by --seed.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="HF folder, .gguf file, hub id or built-in alias")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="folder to write the head to (required, no default)")
    p.add_argument("--data", action="append", type=_source, metavar="SRC",
                   help="a data source: replies, tasks:FILE, text:FILE or chat:FILE (FILE a path or 'calibration', "
                        "the bundled public-domain text); repeat to mix (default: replies)")
    p.add_argument("--tokens", type=positive_int, default=300_000, metavar="N",
                   help="most tokens taken from each data source (prompt + reply for replies), default 300000")
    p.add_argument("--data-cache", type=Path, default=None, metavar="DIR",
                   help="keep each source's data (tokens and the model's hidden states) in DIR, one file per source "
                        "and settings, saved as it is gathered; a later run reuses it and gathers only what more "
                        "--tokens asks for (default: none)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="prompt order, sampling and initialisation")
    p.add_argument("--epochs", type=float, default=2.0, metavar="E", help="passes over the data (default 2)")
    p.add_argument("--draft-vocab", type=non_negative_int, default=8192, metavar="K",
                   help="draft over the K most frequent tokens of the data (FR-Spec); 0: the whole vocabulary "
                        "(default 8192)")
    p.add_argument("--max-reply-tokens", type=positive_int, default=256, metavar="N",
                   help="longest reply sampled per prompt (default 256)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T", help="sampling temperature (default 0.8)")
    p.add_argument("--lr", type=float, default=1e-3, metavar="LR", help="peak learning rate (default 1e-3)")
    p.add_argument("--batch-tokens", type=positive_int, default=2048, metavar="N",
                   help="positions per optimizer step, whole sequences packed together (default 2048)")
    p.add_argument("--unroll", type=positive_int, default=2, metavar="S",
                   help="draft positions trained as drafting runs them, each reading the head's own feature from "
                        "the position before (default 2; 1: only from the target's hidden states, EAGLE-1)")
    p.add_argument("--ce-weight", type=float, default=1.0, metavar="W",
                   help="weight of the cross-entropy against the target's next-token distribution (default 1)")
    p.add_argument("--feature-weight", type=float, default=1.0, metavar="W",
                   help="weight of the smooth-L1 loss against the target's next hidden state (default 1)")
    p.add_argument("--copy-pointer", type=non_negative_int, default=64, metavar="D",
                   help="after the head, train a copy pointer of width D over the context's earlier positions "
                        "(speculative/eagle_pointer.py; the head frozen); 0: none (default 64)")
    p.add_argument("--pointer-epochs", type=float, default=8.0, metavar="E",
                   help="passes over the data for the copy pointer (default 8)")
    p.add_argument("--pointer-match", type=non_negative_int, default=8, metavar="M",
                   help="the copy pointer also reads exact matches: a learned score bias by how many of the "
                        "context's last tokens (up to M) repeat before each earlier position; 0: none (default 8)")
    p.add_argument("--from-head", type=Path, default=None, metavar="DIR",
                   help="start from the head in DIR (trained for MODEL) instead of training one: only the copy "
                        "pointer is trained, and DIR's record of how its head was trained is kept (default: none, "
                        "train a head)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the target's dtype while generating the data (default: auto)")
    p.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="dtype of the saved weights (default bfloat16)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train_draft)


def _source(text: str) -> str:
    kind, _, name = text.partition(":")
    if (kind == "replies" and not name) or (kind in ("text", "chat", "tasks") and name):
        return text
    raise argparse.ArgumentTypeError(f"expected replies, tasks:FILE, text:FILE or chat:FILE, got {text!r}")


def cmd_train_draft(args: argparse.Namespace) -> int:
    from ridgeline.speculative.train_draft_run import run  # torch loads here, not for `ridgeline --help`
    return run(args)
