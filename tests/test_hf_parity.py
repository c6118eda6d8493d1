"""The plain engine matches transformers on the same weights: prefill logits and greedy tokens."""
from __future__ import annotations

import pytest
import torch

from ridgeline import LLM, SamplingParams
from ridgeline.step_plan import ScheduledSeq
from ridgeline.layers.forward_context import forward_context

PROMPTS = ["Hello there, how are you?", "a", "The quick brown fox jumps over the lazy dog " * 3, "0123456789"]


def hf_model(folder):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def hf_greedy(model, ids: list[int], steps: int) -> list[int]:
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(x).logits[0, -1].argmax()
            x = torch.cat([x, nxt.view(1, 1)], dim=1)
    return x[0, len(ids):].tolist()


def engine_logits(llm: LLM, prompts_ids: list[list[int]], chunk: int) -> list[torch.Tensor]:
    """All-position logits through the paged path, prefilling every prompt in chunks of `chunk`."""
    eng = llm.engine
    runner, kv = eng.runner, eng.kv
    out = [[] for _ in prompts_ids]
    starts = [0] * len(prompts_ids)
    while any(s < len(p) for s, p in zip(starts, prompts_ids)):
        seqs = []
        for i, ids in enumerate(prompts_ids):
            if starts[i] < len(ids):
                n = min(chunk, len(ids) - starts[i])
                assert kv.allocate(f"t{i}", starts[i] + n)
                table, more = kv.seq_tables(f"t{i}")
                seqs.append(ScheduledSeq(f"t{i}", starts[i], ids[starts[i]:starts[i] + n], table,
                                         False, SamplingParams(), None, ids, len(ids), group_tables=more))
        seqs.sort(key=lambda s: s.num_new != 1)
        ids_t, pos, ctx, _ = runner.prepare(seqs)
        with torch.inference_mode(), forward_context(ctx):
            logits = runner.model.compute_logits(runner.model(ids_t, pos))
        row = 0
        for s in seqs:
            i = int(s.req_id[1:])
            out[i].append(logits[row:row + s.num_new])
            row += s.num_new
            starts[i] += s.num_new
    for i in range(len(prompts_ids)):
        kv.free(f"t{i}")
    kv.check_integrity()
    return [torch.cat(x) for x in out]


def assert_prefill_matches_transformers(llm: LLM, folder, chunk: int) -> None:
    """Every prompt's all-position logits, prefilled in chunks of `chunk`, against transformers' on the folder."""
    ref = hf_model(folder)
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    for prompt_ids, got in zip(ids, engine_logits(llm, ids, chunk)):
        with torch.no_grad():
            want = ref(torch.tensor([prompt_ids])).logits[0]
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk", [1000, 5])
def test_prefill_logits_match_transformers(tiny_model, chunk):
    arch, folder = tiny_model
    assert_prefill_matches_transformers(LLM(str(folder), dtype="float32", kv_cache_memory="4MiB"), folder, chunk)


@pytest.mark.parametrize("options", [
    {},
    {"max_num_batched_tokens": 7},  # chunked prefill mixed with decodes
    {"kv_cache_memory": 60 * 4 * 512, "block_size": 4},  # 60 blocks of 4: forces preemption
], ids=["plain", "chunked", "preempt"])
def test_greedy_matches_transformers(tiny_model, options):
    arch, folder = tiny_model
    opts = {"kv_cache_memory": "4MiB", **options}
    if arch == "mistral" and "block_size" in options:  # its window bounds each request's blocks (7 of 4
        opts.update(kv_cache_memory=20 * 4 * 512, max_num_batched_tokens=16)  # tokens): 4 need more than 20
    llm = LLM(str(folder), dtype="float32", **opts)
    ref = hf_model(folder)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        want = hf_greedy(ref, llm.tokenizer.encode(prompt), 32)
        assert out.outputs[0].token_ids == want, f"{arch}: {prompt!r}"
        assert out.outputs[0].finish_reason == "length"
    if "block_size" in options:
        assert llm.engine.scheduler.num_preemptions > 0
    llm.engine.kv.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks
