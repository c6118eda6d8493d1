"""Speculative decoding on a GPU machine: `ridgeline bench spec` on a random-weight model of
SmolLM2-135M's shapes (the hub is unreachable from the GPU machine, so no trained EAGLE head
matches it; ngram and layer-skip need no extra weights), batch 1 and 64, controller on and off.
The proposers' greedy-equality and distribution tests run there as plain pytest (device "auto"
picks CUDA); see the README's GPU section.

python3 scripts/cuda_spec_check.py OUT_DIR [cuda|cpu]   (cpu: a short dry run of this script)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_tiny_model  # noqa: E402

from ridgeline.cli import main  # noqa: E402


def run(out: Path, dev: str) -> int:
    with tempfile.TemporaryDirectory() as d:
        shapes = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, max_position_embeddings=2048, vocab_size=49152)
        if dev != "cuda":  # dry run: small and short
            shapes.update(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=2)
        folder = make_tiny_model(Path(d) / "smol", "llama", **shapes)
        n, length, repeats = ("8", "64", "2") if dev == "cuda" else ("2", "8", "1")
        return main(["bench", "spec", "--model", str(folder), "--device", dev, "--dtype", "bfloat16",
                     "--methods", "ngram,layer-skip:8" if dev == "cuda" else "ngram,layer-skip:2",
                     "--workloads", "code-edit,chat", "--batch-sizes", "1,64" if dev == "cuda" else "1,4",
                     "--k", "2", "--requests", n, "--output-len", length, "--repeats", repeats,
                     "--kv-cache-memory", "2GiB" if dev == "cuda" else "64MiB",
                     "--json", str(out / "spec.json"), "--plot", str(out / "spec.png")])


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cuda"))
