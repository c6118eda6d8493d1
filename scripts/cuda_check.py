"""CUDA check, run on a GPU machine: correctness against transformers, the core seams (multi-token
steps, layer ranges and hooks, two engines in one process, prompt logprobs, output deltas) on the
torch path, and a side-by-side timing.

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


def _check(name: str, fn) -> None:
    try:
        print(f"seam {name:34s} {'OK' if fn() else 'MISMATCH'}", flush=True)
    except Exception as e:  # keep going: one report line per check
        print(f"seam {name:34s} ERROR {type(e).__name__}: {e}", flush=True)


def seams(tmp: Path) -> None:
    import random

    from ridgeline.engine.outputs import Accumulator
    from ridgeline.layers.forward_context import forward_context
    from ridgeline.engine.proposal import PROPOSERS, Proposer

    folder = make_tiny_model(tmp / "seams", "llama", num_hidden_layers=4)
    prompts = ["Hello there, how are you?", "a", "The quick brown fox " * 6, "0 1 2 3 4 5 6 7"]
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=1)
    kw = dict(dtype="float32", device=DEV, kv_cache_memory="64MiB", max_num_batched_tokens=16, progress=False)
    base = LLM(str(folder), **kw)
    plain = [o.outputs[0].token_ids for o in base.generate(prompts, greedy, use_tqdm=False)]
    ref = {tuple(base.tokenizer.encode(p)): o for p, o in zip(prompts, plain)}

    class Oracle(Proposer):  # the plain continuation, each token wrong with probability 1/4
        rng = random.Random(0)

        def propose(self, requests):
            out = []
            for r in requests:
                ids = list(r.token_ids)
                full = next((list(p) + o for p, o in ref.items() if ids[:len(p)] == list(p)), ids)
                out.append([t if self.rng.random() > 0.25 else self.rng.randrange(self.vocab_size)
                            for t in full[len(ids):len(ids) + r.k]])
            return out

    PROPOSERS["oracle-check"] = Oracle
    spec = LLM(str(folder), speculative_method="oracle-check", num_speculative_tokens=4, **kw)
    _check("multi-token steps == plain greedy",
           lambda: [o.outputs[0].token_ids for o in spec.generate(prompts, greedy, use_tqdm=False)] == plain
           and spec.engine.spec_stats.accepted > 0)

    def split_equals_whole():
        eng, model = base.engine, base.engine.runner.model.model
        from ridgeline.step_plan import ScheduledSeq
        ids = base.tokenizer.encode(prompts[2])
        assert eng.kv.allocate("x", len(ids))
        seq = ScheduledSeq("x", 0, ids, list(eng.kv.tables["x"]), True, SamplingParams(), None, None, len(ids))
        t, pos, ctx, _ = eng.runner._prepare([seq])
        with torch.inference_mode(), forward_context(ctx):
            whole = model(t, pos)
            h, r, _ = model.run_layers(pos, model.embed(t), None, 0, 2)
            split = model.run_layers(pos, h, r, 2, 4, final_norm=True)[0]
            hooked, _, cap = model.run_layers(pos, model.embed(t), None, 0, 4, final_norm=True,
                                              hook=lambda *a: None, capture=[1])
        eng.kv.free("x")
        return torch.equal(whole, split) and torch.equal(whole, hooked) and 1 in cap

    _check("layer ranges, no-op hook, capture", split_equals_whole)

    def two_engines():
        other = LLM(str(folder), **{**kw, "dtype": "bfloat16"})
        before = [o.outputs[0].token_ids for o in other.generate(prompts, greedy, use_tqdm=False)]
        again = [o.outputs[0].token_ids for o in base.generate(prompts, greedy, use_tqdm=False)]
        return again == plain and [o.outputs[0].token_ids for o in other.generate(prompts, greedy,
                                                                                  use_tqdm=False)] == before

    _check("fp32 and bf16 engines in one process", two_engines)

    def prompt_logprobs():
        import transformers
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(DEV).eval()
        [out] = base.generate(prompts[2], SamplingParams(max_tokens=0, prompt_logprobs=1), use_tqdm=False)
        ids = out.prompt_token_ids
        with torch.no_grad():
            lsm = torch.log_softmax(hf(torch.tensor([ids], device=DEV)).logits[0].double(), -1)
        return all(abs(out.prompt_logprobs[i].logprob - float(lsm[i - 1, ids[i]])) < 1e-3 for i in range(1, len(ids)))

    _check("prompt logprobs vs transformers", prompt_logprobs)

    def deltas_fold():
        eng, acc = base.engine, Accumulator()
        for i, p in enumerate(prompts):
            eng.add_request(f"d{i}", p, greedy)
        while eng.has_unfinished():
            for d in eng.step():
                acc.add(d)
        return [acc.outputs[f"d{i}"].outputs[0].token_ids for i in range(len(prompts))] == plain

    _check("output deltas fold to the whole output", deltas_fold)


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
        seams(Path(d))
        timing(Path(d))
