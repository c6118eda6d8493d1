"""CUDA check, run on a GPU machine: correctness against transformers and a side-by-side timing.

python3 scripts/cuda_check.py   (needs torch with CUDA, transformers, tokenizers, safetensors, jinja2)
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_tiny_model  # noqa: E402

from ridgeline import LLM, SamplingParams  # noqa: E402

MAXTOK = 128
DEV = sys.argv[1] if len(sys.argv) > 1 else "cuda"  # "cpu" for a dry run of this script


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def parity(tmp: Path) -> None:
    import transformers
    for arch in ("llama", "qwen2", "mistral"):
        folder = make_tiny_model(tmp / arch, arch)
        llm = LLM(str(folder), dtype="float32", device=DEV, kv_cache_memory="64MiB",
                  max_num_batched_tokens=16)
        ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(DEV).eval()
        prompts = ["Hello there, how are you?", "a", "The quick brown fox " * 6]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)
        for p, o in zip(prompts, outs):
            x = torch.tensor([llm.tokenizer.encode(p)], device=DEV)
            with torch.no_grad():
                for _ in range(32):
                    x = torch.cat([x, ref(x).logits[:, -1].argmax(-1, keepdim=True)], 1)
            want = x[0, -32:].tolist()
            status = "OK" if o.outputs[0].token_ids == want else "MISMATCH"
            print(f"parity {arch:8s} {p[:20]!r:24s} {status}")


def timing(tmp: Path) -> None:
    import transformers
    # SmolLM2-135M shapes, random weights (the hub is unreachable from the GPU machine)
    folder = make_tiny_model(tmp / "smol", "llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                             vocab_size=49152)
    llm = LLM(str(folder), dtype="bfloat16", device=DEV, kv_cache_memory="4GiB", max_num_batched_tokens=2048)
    print(llm.info.summary())
    torch.manual_seed(0)
    N = 256 if DEV == "cuda" else 8
    prompts = [torch.randint(0, 256, (int(n),)).tolist() for n in torch.randint(50, 200, (N,))]
    params = SamplingParams(temperature=0, max_tokens=MAXTOK, ignore_eos=True)
    llm.generate(prompts[:8], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    sync()
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    sync()
    ours = N * MAXTOK / (time.perf_counter() - t)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(DEV).eval()
    batch = prompts[:64]
    B = len(batch)
    L = max(map(len, batch))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in batch], device=DEV)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in batch], device=DEV)
    t = time.perf_counter()
    with torch.no_grad():
        ref.generate(ids, attention_mask=mask, max_new_tokens=MAXTOK, min_new_tokens=MAXTOK, do_sample=False,
                     pad_token_id=0)
    sync()
    hf = B * MAXTOK / (time.perf_counter() - t)
    print(f"timing bf16 SmolLM2-135M shapes on {torch.cuda.get_device_name() if DEV == 'cuda' else DEV}: ridgeline 256 req x 128 tok "
          f"{ours:.0f} out tok/s; HF padded batch-64 generate {hf:.0f} out tok/s; ratio {ours / hf:.2f}x")


if __name__ == "__main__":
    if DEV != "cuda":
        MAXTOK = 4
    assert DEV != "cuda" or torch.cuda.is_available(), "needs a CUDA device"
    with tempfile.TemporaryDirectory() as d:
        parity(Path(d))
        timing(Path(d))
