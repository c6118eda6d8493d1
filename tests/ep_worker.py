"""What the expert-parallel tests measure, on one rank of a gloo group or in one process: prefill
logits, greedy tokens, one sparse layer's output under both exchanges and the torch path, load
counters and resident weight bytes. Run by torch.multiprocessing (spawned children import this)."""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch

PROMPTS = ["Hello there, how are you?", "a", "The quick brown fox jumps over the lazy dog " * 3, "0123456789"]


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def measure(llm) -> dict:
    from ridgeline import SamplingParams
    from ridgeline.layers.moe import SparseMoE
    from ridgeline.distributed import expert_load
    from ridgeline.layers.expert_compute import TorchExperts
    from test_hf_parity import engine_logits
    model = llm.engine.runner.model
    moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    res = {"logits": engine_logits(llm, ids, 1000)}
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    res["greedy"] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    m = moes[0]
    x = torch.randn(9, m.gate.in_features, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        for dispatch in ("all_to_all", "gather_scatter"):
            if m.ep is not None:
                m.ep.dispatch = dispatch
            res[dispatch] = m(x)
        res["torch"] = (m.ep.forward_replicated(TorchExperts(m), x, m._stats()) if m.ep is not None
                        else m._torch_forward(x))
    res["load"] = [mm.load_counts.clone() for mm in moes]
    experts = [p for mm in moes for _, ex in mm.expert_items() for p in ex.parameters()]
    res["expert_bytes"] = _bytes(experts)
    res["total_bytes"] = _bytes(model.parameters())
    res["experts_held"] = [e for e, _ in moes[0].expert_items()]
    res["summary"] = expert_load.summarize(moes)
    res["metrics"] = {f.name: [(s.labels, s.value) for s in f.samples] for f in expert_load.metric_families(model)}
    return res


def run_rank(rank: int, world: int, port: int, folders: dict, out_dir: str) -> None:
    import torch.distributed as dist
    from ridgeline import LLM
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=180))
    try:
        results = {}
        for arch, folder in folders.items():
            llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", progress=False, expert_parallel=True)
            results[arch] = measure(llm)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
