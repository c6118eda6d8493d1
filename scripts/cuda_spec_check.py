"""Speculative decoding on a GPU machine: `ridgeline bench spec` on a random-weight model of
SmolLM2-135M's shapes (the hub is unreachable from the GPU machine), batch 1 and 64, controller on
and off: ngram and layer-skip (no extra weights), and with `eagle` an EAGLE head trained for that
random model first (`ridgeline train-draft`, its data from the target on the GPU, the head on the
CPU; a random model's replies say little about acceptance: this checks the path and the
controller, not a head's quality). The proposers' greedy-equality and distribution tests run there
as plain pytest (device "auto" picks CUDA); see the README's GPU section.

python3 scripts/cuda_spec_check.py OUT_DIR [cuda|cpu] [eagle]   (cpu: a short dry run of this script)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_tiny_model  # noqa: E402

from ridgeline.cli import main  # noqa: E402


def run(out: Path, dev: str, eagle: bool = False) -> int:
    with tempfile.TemporaryDirectory() as d:
        shapes = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, max_position_embeddings=2048, vocab_size=49152)
        if dev != "cuda":  # dry run: small and short
            shapes.update(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=2)
        folder = make_tiny_model(Path(d) / "smol", "llama", **shapes)
        n, length, repeats = ("8", "64", "2") if dev == "cuda" else ("2", "8", "1")
        methods = "ngram,layer-skip:8" if dev == "cuda" else "ngram,layer-skip:2"
        extra, workloads = [], "code-edit,chat"
        if eagle:
            head = Path(d) / "head"
            rc = main(["train-draft", str(folder), "--out", str(head), "--tokens", "20000" if dev == "cuda" else "600",
                       "--seed", "0", "--epochs", "2", "--max-reply-tokens", "64", "--dtype", "bfloat16",
                       "--draft-vocab", "4096" if dev == "cuda" else "200", "--quiet"])
            if rc:
                return rc
            methods, extra, workloads = "eagle", ["--draft-model", str(head)], "chat"
        return main(["bench", "spec", "--model", str(folder), "--device", dev, "--dtype", "bfloat16", *extra,
                     "--methods", methods,
                     "--workloads", workloads, "--batch-sizes", "1,64" if dev == "cuda" else "1,4",
                     "--k", "2", "--requests", n, "--output-len", length, "--repeats", repeats,
                     "--kv-cache-memory", "2GiB" if dev == "cuda" else "64MiB",
                     "--json", str(out / "spec.json"), "--plot", str(out / "spec.png")])


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cuda", "eagle" in sys.argv[3:]))
