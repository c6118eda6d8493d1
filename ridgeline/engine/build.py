"""How an LLMEngine is put together, one builder per part, in the order they must run:

    resolve_source    the model's files, architecture, device and dtypes (nothing loaded; unknown
                      architectures and bad KV dtypes fail here, before any weight is read)
    start_parallel    the parallel runtime (tensor, pipeline or expert parallel ranks started or
                      joined; sizes that cannot split fail before a rank starts)
    build_model       weight formats per layer, then the model (each rank its own slices)
    plan_kv           the KV layout and the block count every rank agrees on, and the context length
                      that fits it
    build_runner      the runner over the pool, a pipeline stage's part, the second KV tier
    build_scheduler   the KV manager and the scheduler
    build_speculation the proposer and its controller (None when off)
Each returns plain values; LLMEngine.__init__ wires them and owns the result."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ridgeline.config import EngineConfig
from ridgeline.engine.context_length import context_length, with_rope_override
from ridgeline.engine.info import available_memory
from ridgeline.engine.kv_eviction import Evictor, conflict, peak_tokens
from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.engine.parallel_runtime import ParallelRuntime, runtime
from ridgeline.engine.scheduler import Scheduler
from ridgeline.engine.speculation import Speculation
from ridgeline.engine.startup import weight_formats
from ridgeline.errors import InvalidRequestError, ModelLoadError
from ridgeline.kv_spec import KVCacheSpec, kv_formats
from ridgeline.layers.kernel_plan import choose_kernels
from ridgeline.layers.weight_formats import DENSE
from ridgeline.models.loader import build_model as load_model
from ridgeline.layers.build_options import BuildOptions
from ridgeline.models.registry import model_class
from ridgeline.formats import options as quant_options
from ridgeline.runner.kv_store import create_store
from ridgeline.engine.kv_tier import SwapCosts, TierIndex
from ridgeline.runner.model_runner import ModelRunner
from ridgeline.engine.proposal import DraftTarget
from ridgeline.engine.proposal import create_proposer
from ridgeline.utils.device import pick_device, pick_dtype
from ridgeline.weights.hf_config import ArchConfig, load_arch_config
from ridgeline.models.resolve import resolve_model_source

DEFAULT_KV_CAP = 4 << 30


@dataclass(frozen=True)
class Source:
    folder: Path
    gguf_file: Path | None
    quantization: str  # the quantization option resolved (auto: gguf for a GGUF file)
    arch: ArchConfig
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    act_dtype: torch.dtype  # activations: fp32 on a CPU (no casts around the kernels), else the dtype
    formats: tuple  # (K format, V format) of the KV cache

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def resolve_source(config: EngineConfig) -> Source:
    mc, cc = config.model, config.cache
    device = pick_device(mc.device)
    choice = pick_dtype(mc.dtype, device)
    torch.manual_seed(mc.seed)
    folder, gguf_file = resolve_model_source(mc.model, progress=config.progress)
    quantization = quant_options.resolve(mc.quantization, gguf_file)
    arch = with_rope_override(load_arch_config(folder), mc.rope_scaling_dict)
    model_class(arch.architecture)  # unknown architectures fail before any weight is read
    name = str(choice.dtype).removeprefix("torch.")
    try:
        formats = kv_formats(cc.k_dtype, cc.v_dtype, name, arch.head_dim)
    except ValueError as e:
        raise InvalidRequestError(str(e), "kv_cache_dtype") from None
    if cc.kv_eviction != "none":
        why = conflict(cc.kv_eviction, config.speculative.method, arch.sliding_window, config.attention_backend)
        if why:
            raise InvalidRequestError(why, "kv_eviction")
    if config.expert_parallel and arch.moe is None:
        raise InvalidRequestError(f"--expert-parallel needs a mixture-of-experts model; {arch.architecture} "
                                  "has no experts", "expert_parallel")
    act = torch.float32 if device.type == "cpu" else choice.dtype
    return Source(folder, gguf_file, quantization, arch, device, choice.dtype, choice.reason, act, formats)


@dataclass
class Parallel:
    """This process's parallel runtime (at most one kind, engine/parallel_runtime.py), or none."""
    tp: ParallelRuntime | None = None  # tensor parallelism: a slice of every layer
    pp: ParallelRuntime | None = None  # pipeline parallelism: a range of layers
    ep: ParallelRuntime | None = None  # expert parallelism: a block of every sparse layer's experts

    @property
    def group(self) -> ParallelRuntime | None:
        return self.tp or self.pp or self.ep

    @property
    def shards(self) -> ParallelRuntime | None:
        """The runtime whose ranks each hold a slice of every layer (tensor parallelism), or None."""
        return self.tp


def start_parallel(config: EngineConfig, src: Source, rank) -> Parallel:
    pc, arch, device = config.parallel, src.arch, src.device
    if pc.tensor_parallel_size > 1:
        return Parallel(tp=runtime("tensor")(config, arch, device, rank))
    if pc.pipeline_parallel_size > 1:
        return Parallel(pp=runtime("pipeline")(config, arch, device, rank))
    if pc.expert_parallel_size > 1:
        return Parallel(ep=runtime("expert")(config, arch, device, rank))
    return Parallel()


def build_model(config: EngineConfig, src: Source, par: Parallel, max_len: int):
    """(the model, its kernel plan, the quantization applied)."""
    mc = config.model
    plan = choose_kernels(src.device, src.dtype, src.act_dtype)  # before loading: it decides how weights are packed
    formats, tensors, quantization = weight_formats(mc, src.quantization, src.folder, src.gguf_file, src.arch,
                                                     DENSE[src.dtype], plan)
    tp = par.shards
    backend = "h2o" if config.cache.kv_eviction == "h2o" else config.attention_backend
    experts = runtime("expert-sharding")(True) if config.expert_parallel_on else None
    opts = BuildOptions(plan, src.dtype, src.act_dtype, backend, formats, tp.comm if tp else None,
                        experts=experts, stage=par.pp.stage if par.pp else None)
    # with tensor parallelism each rank builds its own heads and widths and reads only its slices
    model = load_model(tp.arch if tp else src.arch, src.folder, opts, src.device, max_len, tensors, tp and tp.slicer)
    return model, plan, quantization


@dataclass(frozen=True)
class KVPlan:
    spec: KVCacheSpec
    kv_bytes: int  # this rank's budget
    own_blocks: int  # what that budget holds
    num_blocks: int  # what every rank holds (the fullest rank's count)
    max_len: int  # the context length: the model's, or what one request may hold in this pool
    one_table: str | None = None  # why a model with local and global layers keeps one table (None: it does not)

    @property
    def capacity(self) -> int:
        return (self.num_blocks - 1) * self.spec.block_size


def plan_kv(config: EngineConfig, src: Source, par: Parallel, max_len: int) -> KVPlan:
    cc, arch, mc = config.cache, src.arch, config.model
    tp, stage = par.shards, par.pp.stage if par.pp else None
    # a rank's KV holds its own KV heads (a stage's, its own layers): the block count is what the
    # fullest rank's budget holds
    k_fmt, v_fmt = src.formats
    groups, one_table = kv_groups(config, src, par)
    spec = KVCacheSpec(k_fmt, len(stage.layers) if stage else arch.num_layers,
                       tp.arch.num_kv_heads if tp else arch.num_kv_heads, arch.head_dim, cc.block_size, v_fmt,
                       groups=groups)
    kv_bytes = cc.kv_cache_memory or min(DEFAULT_KV_CAP, int(available_memory() * cc.kv_cache_fraction))
    own = spec.num_blocks(kv_bytes)
    num_blocks = own if par.group is None else par.group.agree_min(own)
    if num_blocks < 2:
        raise ModelLoadError(f"kv_cache_memory {kv_bytes} B holds no block ({spec.bytes_per_block} B each)")
    capacity = (num_blocks - 1) * cc.block_size
    budget = cc.kv_eviction_budget if cc.kv_eviction != "none" else None
    chunk = config.scheduler.max_num_batched_tokens
    if groups is not None:  # pages, over every group
        def holds(n: int) -> bool:
            return groups.peak_pages(n, chunk, cc.block_size) <= num_blocks - 1
        if not holds(1):
            raise ModelLoadError(f"kv_cache_memory {kv_bytes} B holds {num_blocks - 1} blocks, fewer than this "
                                 f"model's {groups.num_groups} KV groups need for one token; raise --kv-cache-memory")
        fits, lo, hi = holds(max_len), 1, max_len  # longest: the most tokens one request may hold
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if holds(mid) else (lo, mid - 1)
        longest = lo
    else:
        fits = capacity >= peak_tokens(max_len, arch.kv_window, chunk, cc.block_size, budget)
        longest = capacity
    if not fits:
        if mc.max_model_len:
            raise InvalidRequestError(f"max_model_len {max_len} does not fit the KV cache ({longest} tokens); raise "
                                      "--kv-cache-memory or lower --max-model-len", "max_model_len")
        max_len = longest  # one request of max_model_len must always fit
    return KVPlan(spec, kv_bytes, own, num_blocks, max_len, one_table)


def kv_groups(config: EngineConfig, src: Source, par: Parallel):
    """(the KV groups of a model mixing local and global layers, or None; why such a model keeps one
    table for every layer, or None). The features that move or rewrite one table per request keep one."""
    from ridgeline.kv_groups import plan_groups
    arch, cc = src.arch, config.cache
    groups = plan_groups([arch.window_of(i) for i in range(arch.num_layers)])
    if groups is None:
        return None, None
    why = ("--disable-hybrid-kv-cache-manager" if not cc.hybrid_kv_cache else
           "parallel ranks" if par.group is not None else
           "--kv-offload" if cc.kv_offload != "none" else
           "--kv-eviction" if cc.kv_eviction != "none" else
           "a draft model (its KV mirrors the target's blocks)" if "draft" in config.speculative.methods else
           "an EAGLE head (its hidden rows sit beside the target's blocks)" if "eagle" in config.speculative.methods
           else None)
    return (None, why) if why else (groups, None)


def context_of(config: EngineConfig, src: Source) -> int:
    mc = config.model
    return context_length(src.arch, mc.max_model_len, mc.rope_scaling is not None)


def build_runner(config: EngineConfig, src: Source, par: Parallel, model, kv: KVPlan, eos: tuple[int, ...]):
    """(the runner, the second KV tier's index or None, its start-up line or None)."""
    runner = ModelRunner(model, src.arch, src.device, kv.spec, kv.num_blocks, list(eos))
    if par.group is not None:
        par.group.attach(runner, config)  # a pipeline stage's sends and receives
    if par.group is not None and par.group.rank == 0:
        par.group.lead(runner)
    runner.store, tier, line = build_tier(config.cache, kv.spec.bytes_per_block, runner.kv, src.device,
                                          available_memory())
    return runner, tier, line


def build_tier(cc, block_bytes: int, layers: list[LayerKV], device: torch.device, free_memory: int):
    """(store, TierIndex, a line for the start-up summary) for a CacheConfig, or (None, None, None)
    when kv_offload is none or the disk cannot be written."""
    if cc.kv_offload == "none":
        return None, None, None
    store = create_store(cc.kv_offload, cc.kv_offload_size, block_bytes, layers, device, cc.kv_offload_path,
                         free_memory)
    if store is None:
        return None, None, f"{cc.kv_offload} tier disabled (its file cannot be written): evicted blocks are recomputed"
    rate = 8e9 if cc.kv_offload == "cpu" else 1e9  # bytes/s until measured
    tier = TierIndex(cc.kv_offload, store.num_slots, block_bytes, SwapCosts(cc.preemption_mode, rate))
    line = (f"{cc.kv_offload} tier of {store.num_slots} blocks ({store.num_slots * block_bytes / 2**30:.2f} GiB, "
            f"{store.where}); preemption {cc.preemption_mode}")
    return store, tier, line


def build_scheduler(config: EngineConfig, src: Source, kv: KVPlan, tier) -> tuple[KVCacheManager, Scheduler]:
    cc = config.cache
    evict = cc.kv_eviction != "none"
    # eviction rewrites a request's blocks in place: none of them may be cached (or shared)
    groups = kv.spec.groups
    manager = KVCacheManager(kv.num_blocks, cc.block_size, enable_caching=cc.enable_prefix_caching and not evict,
                             window=None if groups else src.arch.kv_window, tier=tier, groups=groups)
    evictor = Evictor(cc.kv_eviction, cc.kv_eviction_budget, cc.kv_sink_tokens) if evict else None
    return manager, Scheduler(config.scheduler, manager, evictor)


def build_speculation(config: EngineConfig, src: Source, kv: KVPlan, runner, manager, scheduler,
                      eos: tuple[int, ...]):
    """(the Speculation, its proposer), or (None, None) with speculation off."""
    cc = config.cache
    draft_kv = kv_formats("auto", "auto", src.dtype_name, src.arch.head_dim)[0].name
    target = DraftTarget(src.folder, src.device, src.dtype, src.act_dtype, config.attention_backend, kv.max_len,
                         cc.block_size, kv.num_blocks, draft_kv, eos, config.progress, runner, manager,
                         scheduler.watermark)
    proposer = create_proposer(config.speculative, src.arch.vocab_size, target)
    if proposer is None:
        return None, None
    return Speculation(config.speculative, proposer, src.arch.vocab_size, kv.max_len), proposer
