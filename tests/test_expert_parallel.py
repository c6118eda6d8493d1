"""Expert parallelism on two gloo ranks (spawned here) against the single-process engine on tiny
random Mixtral, Qwen2-MoE (shared expert, a dense layer) and Qwen3-MoE models: prefill logits and a
sparse layer's output within a tight bound under both exchanges (all-to-all; all-gather +
reduce-scatter) and the torch path, greedy tokens identical, the whole group's expert load counted
on every rank, and each rank holding only its half of the experts."""
from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from conftest import MOE_ARCHS, make_tiny_model
from ep_worker import measure, run_rank
from ridgeline import LLM
from ridgeline.errors import InvalidRequestError

WORLD = 2
ATOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{arch: (single-process results, [rank 0, rank 1] results)}"""
    folders = {arch: make_tiny_model(tmp_path_factory.mktemp(f"ep-{arch}"), arch) for arch in MOE_ARCHS}
    out = tmp_path_factory.mktemp("ep-out")
    mp.spawn(run_rank, args=(WORLD, _free_port(), folders, str(out)), nprocs=WORLD, join=True)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]
    torch.set_num_threads(1)
    single = {arch: measure(LLM(str(f), dtype="float32", kv_cache_memory="4MiB", progress=False))
              for arch, f in folders.items()}
    return {arch: (single[arch], [r[arch] for r in ranks]) for arch in folders}


@pytest.mark.slow  # starts rank / worker processes
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_logits_and_greedy_match_single_process(runs, arch):
    single, ranks = runs[arch]
    for got in ranks:
        for a, b in zip(got["logits"], single["logits"]):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
        assert got["greedy"] == single["greedy"]


@pytest.mark.slow  # starts rank / worker processes
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_layer_matches_under_both_exchanges_and_torch(runs, arch):
    single, ranks = runs[arch]
    for got in ranks:
        torch.testing.assert_close(got["all_to_all"], single["all_to_all"], atol=ATOL, rtol=0)
        torch.testing.assert_close(got["gather_scatter"], single["gather_scatter"], atol=ATOL, rtol=0)
        torch.testing.assert_close(got["torch"], single["torch"], atol=ATOL, rtol=0)


@pytest.mark.slow  # starts rank / worker processes
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_each_rank_holds_its_experts_and_counts_the_group_load(runs, arch):
    single, ranks = runs[arch]
    experts = single["experts_held"]
    replicated = single["total_bytes"] - single["expert_bytes"]
    half = len(experts) // WORLD
    for r, got in enumerate(ranks):
        assert got["experts_held"] == experts[r * half:(r + 1) * half]
        assert got["expert_bytes"] == single["expert_bytes"] // WORLD
        assert got["total_bytes"] == replicated + single["expert_bytes"] // WORLD
        for a, b in zip(got["load"], single["load"]):
            assert torch.equal(a, b)
        rank_pairs = [sum(int(c[q * half:(q + 1) * half].sum()) for c in single["load"]) for q in range(WORLD)]
        assert got["summary"]["rank_pairs"] == rank_pairs and sum(rank_pairs) == single["summary"]["pairs"]
        assert got["summary"]["rank_imbalance"]["max"] >= 1.0
        assert got["metrics"]["ridgeline_moe_rank_routed_pairs"] == [({"rank": str(q)}, n)
                                                                     for q, n in enumerate(rank_pairs)]
    assert "ridgeline_moe_rank_routed_pairs" not in single["metrics"]
    assert single["metrics"]["ridgeline_moe_routed_pairs"][0][1] == single["summary"]["pairs"]
    assert single["summary"]["expert_imbalance"]["max"] >= 1.0


def test_expert_parallel_needs_a_distributed_launch_and_experts(tmp_path):
    with pytest.raises(InvalidRequestError, match="torch.distributed is not initialised"):
        LLM(str(make_tiny_model(tmp_path / "moe", "mixtral")), dtype="float32", kv_cache_memory="4MiB",
            progress=False, expert_parallel=True)
    with pytest.raises(InvalidRequestError, match="needs a mixture-of-experts model"):
        LLM(str(make_tiny_model(tmp_path / "dense", "llama")), dtype="float32", kv_cache_memory="4MiB",
            progress=False, expert_parallel=True)
