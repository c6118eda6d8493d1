"""One frozen config tree, validated once at the entry point and passed down whole.

Values measured at runtime (KV block count, EOS ids, chosen dtype) live in
`ridgeline.engine.info.EngineInfo`, never written back here.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ridgeline.errors import InvalidRequestError
from ridgeline.kv_spec import check_kv_cache_dtype
from ridgeline.layers.rope_scaling import parse_override
from ridgeline.formats import options as quant_options

DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_EVICTION = ("none", "streaming", "h2o")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}


def parse_bytes(text: str | int) -> int:
    """'2GiB' -> 2147483648; plain integers are bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InvalidRequestError(f"cannot parse a size from {text!r} (examples: 512MiB, 2GiB, 1e9)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class ModelConfig:
    model: str = "smollm2-135m"
    dtype: str = "auto"
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    device: str = "auto"  # auto: cuda if available else cpu
    seed: int = 0
    # per-layer weight formats: (glob over layer names such as "model.layers.3.*", format name), first
    # match wins; unmatched layers keep the dense format of `dtype`
    layer_formats: tuple[tuple[str, str], ...] = ()
    # weight quantization of every Linear, the LM head included (ridgeline/formats/options.py): auto (gguf
    # for a .gguf model, else none), none, int8, int4, w8a8, w4a8, gguf, gguf-a8
    quantization: str = "auto"
    quant_group_size: int | None = None  # int4: 32 (default), 64 or 128 input columns per scale
    quant_symmetric: bool = False  # int4: scale only, no per-group minimum
    # RoPE scaling override (JSON object, layers/rope_scaling.py): replaces the config's rope_scaling
    rope_scaling: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "layer_formats", tuple((str(p), str(f)) for p, f in self.layer_formats))
        if self.quantization is None:  # as vLLM spells "no quantization"
            object.__setattr__(self, "quantization", "none")
        quant_options.check(self.quantization, self.quant_group_size, self.quant_symmetric)
        if self.dtype not in DTYPES:
            raise InvalidRequestError(f"dtype must be one of {DTYPES}, got {self.dtype!r}", "dtype")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidRequestError("max_model_len must be >= 2", "max_model_len")
        if self.rope_scaling is not None:  # checked once, kept as canonical JSON (hashable)
            object.__setattr__(self, "rope_scaling", json.dumps(parse_override(self.rope_scaling), sort_keys=True))

    @property
    def rope_scaling_dict(self) -> dict | None:
        return json.loads(self.rope_scaling) if self.rope_scaling else None

    @property
    def weight_format(self) -> str | None:
        """The registry name of the quantized format the Linears take; None: dense in `dtype`."""
        return quant_options.format_name(self.quantization, self.quant_group_size, self.quant_symmetric)

    @property
    def format_rules(self) -> tuple[tuple[str, str], ...]:
        """layer_formats, then the rules the quantization implies (int4: an int8 LM head); first match wins."""
        return self.layer_formats + quant_options.implied_rules(self.quantization)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    kv_cache_memory: int | None = None  # bytes; None: kv_cache_fraction of available memory
    kv_cache_fraction: float = 0.25
    enable_prefix_caching: bool = True  # reuse KV blocks of identical prompt prefixes across requests
    # how K and V are stored (ridgeline/kv_spec.py KV_CACHE_DTYPES): auto (the model's dtype), float32,
    # bfloat16, float16, int8, int4, fp8_e4m3 (fp8), fp8_e5m2; _k / _v override it for K or V alone
    kv_cache_dtype: str = "auto"
    kv_cache_dtype_k: str | None = None
    kv_cache_dtype_v: str | None = None
    # lossy, opt-in (ridgeline/engine/kv_eviction.py): keep at most kv_eviction_budget tokens of KV per
    # request, the first kv_sink_tokens always; "streaming": the most recent others; "h2o": the most recent
    # half and the others with the most accumulated attention
    kv_eviction: str = "none"
    kv_eviction_budget: int = 1024
    kv_sink_tokens: int = 4
    # second KV tier (engine/kv_tier.py, runner/kv_store.py): none, cpu (host memory) or disk (one
    # preallocated file in kv_offload_path, default the temp directory); kv_offload_size bytes of it
    kv_offload: str = "none"
    kv_offload_size: int | None = None
    kv_offload_path: str | None = None
    # a preempted request: swap its blocks to the tier or recompute them; auto: whichever is measured cheaper
    preemption_mode: str = "auto"
    # models mixing sliding-window and full-attention layers: a block table per KV group (local, global),
    # the local groups' blocks behind their window freed (ridgeline/kv_groups.py); False: one table for
    # every layer, every block kept (vLLM's --disable-hybrid-kv-cache-manager)
    hybrid_kv_cache: bool = True

    @property
    def k_dtype(self) -> str:
        return self.kv_cache_dtype_k or self.kv_cache_dtype

    @property
    def v_dtype(self) -> str:
        return self.kv_cache_dtype_v or self.kv_cache_dtype

    def __post_init__(self):
        for name in ("kv_cache_dtype", "kv_cache_dtype_k", "kv_cache_dtype_v"):
            try:
                check_kv_cache_dtype(getattr(self, name), name, optional=name != "kv_cache_dtype")
            except ValueError as e:
                raise InvalidRequestError(str(e), name) from None
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise InvalidRequestError("block_size must be a power of two", "block_size")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise InvalidRequestError("kv_cache_memory must be positive", "kv_cache_memory")
        if self.kv_eviction not in KV_EVICTION:
            raise InvalidRequestError(f"kv_eviction must be one of {', '.join(KV_EVICTION)}, got {self.kv_eviction!r}",
                                      "kv_eviction")
        if self.kv_sink_tokens < 0:
            raise InvalidRequestError("kv_sink_tokens must be >= 0", "kv_sink_tokens")
        if self.kv_eviction != "none" and self.kv_sink_tokens == 0 and self.k_dtype == "int4":
            raise InvalidRequestError("an int4 K cache stores the key at position 0 with a center of its own, so "
                                      "kv_eviction must keep it: kv_sink_tokens must be >= 1", "kv_sink_tokens")
        if self.kv_eviction != "none" and self.kv_eviction_budget < self.kv_sink_tokens + self.block_size:
            raise InvalidRequestError(
                f"kv_eviction_budget {self.kv_eviction_budget} must hold the {self.kv_sink_tokens} sink tokens "
                f"and at least one block ({self.block_size} tokens) more", "kv_eviction_budget")
        if not 0 < self.kv_cache_fraction <= 0.95:
            raise InvalidRequestError("kv_cache_fraction must be in (0, 0.95]", "kv_cache_fraction")
        if self.kv_offload not in ("none", "cpu", "disk"):
            raise InvalidRequestError(f"kv_offload must be none, cpu or disk, got {self.kv_offload!r}", "kv_offload")
        if (self.kv_offload != "none") != (self.kv_offload_size is not None):
            raise InvalidRequestError("kv_offload cpu or disk needs kv_offload_size (e.g. 2GiB), and "
                                      "kv_offload_size needs kv_offload cpu or disk", "kv_offload_size")
        if self.kv_offload_size is not None and self.kv_offload_size <= 0:
            raise InvalidRequestError("kv_offload_size must be positive", "kv_offload_size")
        if self.preemption_mode not in ("auto", "swap", "recompute"):
            raise InvalidRequestError("preemption_mode must be auto, swap or recompute, got "
                                      f"{self.preemption_mode!r}", "preemption_mode")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 256

    def __post_init__(self):
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise InvalidRequestError("max_num_batched_tokens and max_num_seqs must be >= 1")


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters (ridgeline/lora): off unless enable_lora; ranks up to max_lora_rank (at most 256)."""
    enable_lora: bool = False  # LLM(...): requests may name adapters (lora_request; docs/features/lora.md)
    max_lora_rank: int = 64  # an adapter of a higher rank is refused

    def __post_init__(self):
        if not isinstance(self.enable_lora, bool):
            raise InvalidRequestError("enable_lora must be true or false", "enable_lora")
        r = self.max_lora_rank
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 256:
            raise InvalidRequestError(f"max_lora_rank must be an integer in [1, 256], not {r!r}", "max_lora_rank")


@dataclass(frozen=True)
class SpeculativeConfig:
    # a registered proposer (ridgeline.engine.proposal.PROPOSERS), or several joined by "+" (speculative/cascade.py:
    # each request takes the first that proposes, e.g. "ngram+eagle"); None (or "none"): off
    speculative_method: str | None = None
    num_speculative_tokens: int = 4  # proposals per request per step, at most
    ngram_min: int = 2  # `ngram` proposer: the shortest suffix it looks up
    ngram_max: int = 4  # ... and the longest (tried first)
    # "on": the goodput controller picks k (0 = off) per step and request, at most num_speculative_tokens;
    # "off": every decoding request drafts num_speculative_tokens (for benchmarks)
    speculative_controller: str = "on"
    # `draft` proposer: the draft model (path, hub id or alias; "self": the target's own weights) and
    # the quantization of its weights (none, int8, int4); `eagle`: the folder of a trained head (None:
    # the one shipped for the target, ridgeline/speculative/heads/)
    draft_model: str | None = None
    draft_quantization: str = "none"
    # `layer-skip` proposer: the draft is the target's first speculative_layers layers, its final norm
    # and its LM head (1 <= L < the target's layers, checked against the model at start-up)
    speculative_layers: int | None = None

    @property
    def method(self) -> str | None:
        return self.speculative_method

    @property
    def methods(self) -> tuple[str, ...]:
        """The proposers chained in speculative_method, in order (one for a single method)."""
        return () if self.speculative_method is None else tuple(self.speculative_method.split("+"))

    def __post_init__(self):
        if self.speculative_method == "none":  # said explicitly: off
            object.__setattr__(self, "speculative_method", None)
        if not 1 <= self.num_speculative_tokens <= 64:
            raise InvalidRequestError("num_speculative_tokens must be in [1, 64]", "num_speculative_tokens")
        if not 1 <= self.ngram_min <= self.ngram_max <= 64:
            raise InvalidRequestError("ngram sizes need 1 <= ngram_min <= ngram_max <= 64", "ngram_min")
        if self.speculative_controller not in ("on", "off"):
            raise InvalidRequestError("speculative_controller must be 'on' or 'off', got "
                                      f"{self.speculative_controller!r}", "speculative_controller")
        methods = self.methods
        if any(not m for m in methods) or len(set(methods)) != len(methods) or {"draft", "eagle"} <= set(methods):
            raise InvalidRequestError(f"speculative_method {self.speculative_method!r}: proposers joined by '+' must "
                                      "be named once each, and 'draft' and 'eagle' (which would share draft_model) "
                                      "not together", "speculative_method")
        # eagle without draft_model: the head shipped for the target (an error at start-up if none is)
        if ("draft" in methods and self.draft_model is None) or \
                (self.draft_model is not None and not {"draft", "eagle"} & set(methods)):
            raise InvalidRequestError("speculative_method 'draft' needs draft_model (a model with the target's "
                                      "tokenizer, or 'self'), and draft_model needs speculative_method 'draft' or "
                                      "'eagle' (a head trained for the target by `ridgeline train-draft`)",
                                      "draft_model")
        if ("layer-skip" in methods) != (self.speculative_layers is not None):
            raise InvalidRequestError("speculative_method 'layer-skip' needs speculative_layers (the target layers "
                                      "the draft runs), and speculative_layers needs speculative_method "
                                      "'layer-skip'", "speculative_layers")
        if self.speculative_layers is not None and self.speculative_layers < 1:
            raise InvalidRequestError(f"speculative_layers must be >= 1, got {self.speculative_layers}",
                                      "speculative_layers")
        if self.draft_quantization not in quant_options.QUANTIZATIONS or \
                self.draft_quantization in quant_options.PREQUANTIZED:
            allowed = [q for q in quant_options.QUANTIZATIONS if q not in quant_options.PREQUANTIZED]
            raise InvalidRequestError(f"draft_quantization must be one of {', '.join(allowed)}, "
                                      f"got {self.draft_quantization!r}", "draft_quantization")


@dataclass(frozen=True)
class ParallelConfig:
    # ranks splitting every layer (ridgeline/distributed/layout.py); > 1 starts the other ranks on this
    # machine, or joins torchrun's group when RANK / WORLD_SIZE are set
    tensor_parallel_size: int = 1
    master_addr: str | None = None  # None: $MASTER_ADDR, else 127.0.0.1
    master_port: int | None = None  # None: $MASTER_PORT, else a free port
    dist_timeout: float = 60.0  # seconds a rendezvous or a collective may take before the ranks give up
    # torchrun: the file with the secret every rank shares (utils/internal_auth.py); one machine: a new one each launch
    internal_secret_file: str | None = None
    pin_cores: bool = True  # one machine: each rank pinned to its share of the cores, with as many threads
    # stages holding contiguous layer ranges (ridgeline/distributed/stages.py); started like the ranks above
    pipeline_parallel_size: int = 1
    pipeline_microbatches: int | None = None  # micro-batches per step; None: one per stage
    # expert parallelism with its own ranks (distributed/ep_runtime.py): > 1 starts them like tensor parallelism's,
    # every layer whole on each rank but the experts, placed over the ranks
    expert_parallel_size: int = 1

    def __post_init__(self):
        if self.tensor_parallel_size < 1:
            raise InvalidRequestError("tensor_parallel_size must be >= 1", "tensor_parallel_size")
        if self.pipeline_parallel_size < 1:
            raise InvalidRequestError("pipeline_parallel_size must be >= 1", "pipeline_parallel_size")
        if self.pipeline_microbatches is not None and self.pipeline_microbatches < 1:
            raise InvalidRequestError("pipeline_microbatches must be >= 1", "pipeline_microbatches")
        if self.expert_parallel_size < 1:
            raise InvalidRequestError("expert_parallel_size must be >= 1", "expert_parallel_size")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise InvalidRequestError("master_port must be in [1, 65535]", "master_port")
        if not self.dist_timeout > 0:
            raise InvalidRequestError("dist_timeout must be > 0", "dist_timeout")


def _parallel_conflicts(cfg: "EngineConfig") -> None:
    """What tensor and pipeline parallelism do not combine with yet: refused at start-up, by name."""
    _pipeline_conflicts(cfg)
    if cfg.parallel.tensor_parallel_size == 1:
        return
    bad = [(cfg.speculative.method is not None, "speculative_method", "speculative decoding"),
           (cfg.cache.kv_eviction == "h2o", "kv_eviction", "h2o eviction (its attention scores are per rank)"),
           (cfg.cache.k_dtype == "int4", "kv_cache_dtype", "an int4 K cache (its centers are calibrated on "
            "one rank)")]
    for hit, param, what in bad:
        if hit:
            raise InvalidRequestError(f"{what} does not run with tensor_parallel_size > 1 yet", param)


def _pipeline_conflicts(cfg: "EngineConfig") -> None:
    if cfg.parallel.pipeline_parallel_size == 1:
        return
    bad = [(cfg.parallel.tensor_parallel_size > 1, "tensor_parallel_size",
            "tensor parallelism inside pipeline stages (TP x PP)"),
           (cfg.expert_parallel_on, "expert_parallel", "expert parallelism (--expert-parallel)"),
           (cfg.speculative.method is not None, "speculative_method", "speculative decoding"),
           (cfg.cache.kv_eviction == "h2o", "kv_eviction", "h2o eviction (its attention scores are per stage)"),
           (cfg.cache.kv_offload != "none", "kv_offload", "the KV offload tier"),
           (cfg.cache.k_dtype == "int4", "kv_cache_dtype", "an int4 K cache (its centers are calibrated in one "
            "process)")]
    for hit, param, what in bad:
        if hit:
            raise InvalidRequestError(f"{what} does not run with pipeline_parallel_size > 1 yet", param)


def _expert_parallel_conflicts(cfg: "EngineConfig") -> None:
    """What expert parallelism does not combine with yet: refused at start-up, by name."""
    pc = cfg.parallel
    if pc.tensor_parallel_size > 1 and (cfg.expert_parallel or pc.expert_parallel_size > 1):
        raise InvalidRequestError(
            "expert parallelism with tensor_parallel_size > 1 is not supported yet (tensor parallelism splits "
            "every expert's width over its ranks instead); use --expert-parallel-size N alone", "expert_parallel")
    if pc.expert_parallel_size == 1:
        return
    bad = [(cfg.speculative.method is not None, "speculative_method", "speculative decoding"),
           (cfg.cache.kv_eviction == "h2o", "kv_eviction", "h2o eviction"),
           (cfg.cache.k_dtype == "int4", "kv_cache_dtype", "an int4 K cache (its centers are calibrated on one rank)")]
    for hit, param, what in bad:
        if hit:
            raise InvalidRequestError(f"{what} does not run with expert_parallel_size > 1 yet", param)


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    attention_backend: str = "auto"
    progress: bool = True
    # sparse layers' experts spread over the ranks of a distributed launch (distributed/expert_group.py)
    expert_parallel: bool = False

    def __post_init__(self):
        _parallel_conflicts(self)
        _expert_parallel_conflicts(self)

    @property
    def expert_parallel_on(self) -> bool:
        """Sparse layers spread their experts over ranks: in a launch the caller made (expert_parallel) or
        over ranks the engine starts or joins (expert_parallel_size > 1)."""
        return self.expert_parallel or self.parallel.expert_parallel_size > 1

    @classmethod
    def from_kwargs(cls, model: str = "smollm2-135m", **kw) -> "EngineConfig":
        """Flat keyword arguments (as the CLI and `LLM(...)` take them) -> the tree."""
        groups = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig,
                  "speculative": SpeculativeConfig, "parallel": ParallelConfig, "lora": LoRAConfig}
        parts: dict[str, dict] = {name: {} for name in groups}
        parts["model"]["model"] = model
        top = {}
        for size in ("kv_cache_memory", "kv_offload_size"):
            if kw.get(size) is not None:
                kw[size] = parse_bytes(kw[size])
        for key, value in kw.items():
            owner = next((g for g, c in groups.items() if key in c.__dataclass_fields__), None)
            if owner is not None:
                parts[owner][key] = value
            elif key in cls.__dataclass_fields__:
                top[key] = value
            else:
                raise InvalidRequestError(f"unknown engine option {key!r}", key)
        return cls(**{g: groups[g](**parts[g]) for g in groups}, **top)
