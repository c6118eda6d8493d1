"""The engine's flags, the option table every command that loads a model shares (`ridgeline generate`,
`chat`, `serve`, `bench ...`, `eval`; vLLM's EngineArgs): `add_engine_args` puts the engine and parallelism
groups on a parser, `engine_kwargs` turns the parsed namespace into the keyword arguments of
`EngineConfig.from_kwargs` (what `LLM(model, **kw)` takes). Of the parallelism flags, only those the parser
has are passed on."""
from __future__ import annotations

import argparse

from ridgeline.cli_parser import positive_int
from ridgeline.kv_spec import KV_CACHE_DTYPES
from ridgeline.formats.options import QUANTIZATIONS


def speculative_method(text: str) -> str:
    """A proposer's name, or several joined by '+' (ngram+eagle), each a known one; `none`: off."""
    from ridgeline.engine.proposal import known_methods
    if text == "none":
        return text
    known = known_methods()
    bad = [m for m in text.split("+") if m not in known]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown speculative method {bad[0]!r} in {text!r}: choose from "
                                         f"{', '.join(known)}, or several joined by '+' (e.g. ngram+eagle)")
    return text


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="smollm2-135m", help="HF folder, .gguf file, hub id, or built-in alias")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="compute dtype; auto: bfloat16 where the device multiplies it natively, else float32")
    g.add_argument("--max-model-len", type=int, default=None, metavar="N",
                   help="longest prompt + output in tokens (default: the model's maximum context, or with "
                        "--rope-scaling its original length x factor); beyond that it runs, with a warning")
    g.add_argument("--rope-scaling", default=None, metavar="JSON",
                   help='override the model\'s RoPE scaling, e.g. \'{"rope_type": "yarn", "factor": 4}\'; '
                        "rope_type linear, dynamic (NTK), yarn or llama3 (default: the model's own)")
    g.add_argument("--device", default="auto", help="cpu, cuda or cuda:N; auto: cuda when available, else cpu")
    g.add_argument("--kv-cache-memory", default=None, metavar="SIZE",
                   help="KV cache size, e.g. 2GiB (default: 25%% of free memory, at most 4 GiB)")
    kv_choices = list(KV_CACHE_DTYPES)
    g.add_argument("--kv-cache-dtype", default="auto", choices=kv_choices,
                   help="how K and V are stored: auto keeps --dtype; int8 (a scale per token and head), int4 "
                        "(Hadamard-rotated, groups of 32) and fp8 (e4m3 = fp8, e5m2; scales from the data) hold "
                        "~1.9x / ~3.5x / ~1.9x the tokens of bfloat16 in the same --kv-cache-memory")
    g.add_argument("--kv-cache-dtype-k", default=None, choices=kv_choices, metavar="DTYPE",
                   help="K alone (default: --kv-cache-dtype)")
    g.add_argument("--kv-cache-dtype-v", default=None, choices=kv_choices, metavar="DTYPE",
                   help="V alone (default: --kv-cache-dtype)")
    g.add_argument("--kv-eviction", default="none", choices=["none", "streaming", "h2o"],
                   help="lossy: keep at most --kv-eviction-budget tokens of KV per request, the first "
                        "--kv-sink-tokens always; streaming keeps the most recent others (StreamingLLM), h2o the "
                        "most recent half and the tokens that received the most attention (heavy hitters); "
                        "turns prefix caching off")
    g.add_argument("--kv-eviction-budget", type=int, default=1024, metavar="N",
                   help="--kv-eviction: tokens of KV a request keeps at most (at least the sinks and one block)")
    g.add_argument("--kv-sink-tokens", type=int, default=4, metavar="N",
                   help="--kv-eviction: the first N tokens of a request are never evicted (attention sinks)")
    g.add_argument("--kv-offload", default="none", choices=["none", "cpu", "disk"],
                   help="a second KV tier: prefix-cache blocks evicted from the cache and the blocks of preempted "
                        "requests are kept there (cpu: host memory; disk: one preallocated file) and loaded back "
                        "instead of recomputed; needs --kv-offload-size")
    g.add_argument("--kv-offload-size", default=None, metavar="SIZE", help="size of the second KV tier, e.g. 2GiB (default: none; needed with --kv-offload)")
    g.add_argument("--kv-offload-path", default=None, metavar="DIR",
                   help="disk tier: the directory of its file (default: the temp directory)")
    g.add_argument("--preemption-mode", default="auto", choices=["auto", "swap", "recompute"],
                   help="a preempted request's KV: swap it to the --kv-offload tier or recompute it later; auto: "
                        "whichever the measured tier copy rate and prefill rate say is faster")
    g.add_argument("--block-size", type=int, default=16, metavar="N",
                   help="tokens per KV cache block, a power of two")
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="do not reuse KV blocks of identical prompt prefixes across requests")
    g.add_argument("--disable-hybrid-kv-cache-manager", dest="hybrid_kv_cache", action="store_false",
                   help="a model mixing sliding-window and full-attention layers (Gemma 2/3, GPT-OSS) keeps one block "
                        "table for every layer and every block, instead of a table per layer group with the "
                        "local layers' blocks behind their window freed")
    g.add_argument("--max-num-batched-tokens", type=int, default=512, metavar="N",
                   help="tokens one engine step computes, prefill chunks and decodes together")
    g.add_argument("--max-num-seqs", type=int, default=256, metavar="N", help="requests running at once")
    g.add_argument("--seed", type=int, default=0, metavar="N",
                   help="engine random seed, used by requests without their own")
    g.add_argument("--quantization", default="auto", choices=list(QUANTIZATIONS),
                   help="weights of every linear layer and the LM head, quantized at load (round-to-nearest): "
                        "int8 per output channel; int4 in groups of --quant-group-size; w8a8 and w4a8 the same "
                        "weights with each layer's input quantized to int8 too (integer dot products); fp8 "
                        "(E4M3, per-channel scales), mxfp8 (E4M3, blocks of 32, E8M0 scales), mxfp4 (E2M1, "
                        "blocks of 32) and nvfp4 (E2M1, blocks of 16, E4M3 scales): mxfp4 and nvfp4 quantize "
                        "each layer's input to int8 per block too; gguf keeps a GGUF file's quantized blocks; gguf-a8 "
                        "runs them against int8 activations (w4a8's kernel for Q4_0 / Q4_1 / Q4_K, w8a8-g32's "
                        "for the rest); "
                        "none dequantizes them to --dtype; gptq, awq: a folder quantized that way; auto: gguf for a .gguf "
                        "model, a folder's own quantization_config (gptq, awq, fp8), else none")
    g.add_argument("--quant-group-size", type=int, default=None, choices=[32, 64, 128], metavar="{32,64,128}",
                   help="int4, w4a8: input columns per scale (default: 32)")
    g.add_argument("--quant-symmetric", action="store_true",
                   help="int4, w4a8: a scale per group and no minimum (default: asymmetric, scale and minimum)")
    g.add_argument("--speculative-method", default=None, type=speculative_method, metavar="METHOD",
                   help="propose tokens for each decoding request and verify them in the same step "
                        "(ngram: prompt lookup; draft: a draft model, --draft-model; layer-skip: the target's "
                        "first --speculative-layers layers and its head; eagle: a head trained by "
                        "`ridgeline train-draft`, --draft-model DIR, or the head shipped for the model; grammar: only the "
                        "tokens a structured output forces next, which every method drafts first; several joined "
                        "by '+', e.g. ngram+eagle: each request takes the first that proposes; none: off, the "
                        "default)")
    g.add_argument("--num-speculative-tokens", type=int, default=4, metavar="K",
                   help="most tokens proposed per request per step")
    g.add_argument("--draft-model", default=None, metavar="PATH",
                   help="draft: a model with the target's tokenizer (folder, .gguf, hub id or alias), or 'self' "
                        "(the target's own weights, see --draft-quantization); eagle: the folder of a head "
                        "trained for this model (default: the one shipped for it, if any); default: none")
    g.add_argument("--speculative-layers", type=int, default=None, metavar="L",
                   help="layer-skip: the draft runs the target's first L layers (1 <= L < its layers), then "
                        "its final norm and head; no extra weights or KV cache (default: none)")
    g.add_argument("--draft-quantization", default="none", choices=["none", "int8", "int4"],
                   help="draft: quantize the draft model's weights at load")
    g.add_argument("--speculative-controller", default="on", choices=["on", "off"],
                   help="on: choose how many tokens to propose (0 = none) per step and request from the measured "
                        "step cost and each request's acceptance, never slowing a batch down; off: always K")
    add_parallel_args(p)


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split every layer over N ranks (whole GQA groups of attention heads, the MLP width, the "
                        "vocabulary); on one machine the engine starts ranks 1..N-1 itself, each pinned to its "
                        "share of the cores; under torchrun each process is one rank (RANK, WORLD_SIZE)")
    g.add_argument("--pipeline-parallel-size", type=int, default=1, metavar="N",
                   help="split the layers into N stages of contiguous layers (embedding on the first, final norm "
                        "and LM head on the last), each loading only its layers' weights and KV; started like "
                        "the tensor-parallel ranks (not combined with them yet)")
    g.add_argument("--pipeline-microbatches", type=int, default=None, metavar="M",
                   help="micro-batches a step's sequences are split into so the stages overlap (default: one "
                        "per stage, fewer when a step has fewer sequences)")
    g.add_argument("--master-addr", default=None, metavar="HOST",
                   help="address of rank 0's rendezvous store (default: $MASTER_ADDR, else 127.0.0.1)")
    g.add_argument("--master-port", type=int, default=None, metavar="PORT",
                   help="its port (default: $MASTER_PORT, else a free port, so two servers on a host never collide)")
    g.add_argument("--internal-secret-file", default=None, metavar="FILE",
                   help="the secret every process of a deployment shares (at least 16 bytes, mode 600): ranks "
                        "started by torchrun, disaggregation workers started by hand, a router's tenants; internal "
                        "channels admit only peers that prove they hold it (default: $RIDGELINE_INTERNAL_SECRET; "
                        "one-machine launches make their own)")
    g.add_argument("--dist-timeout", type=float, default=60.0, metavar="S",
                   help="seconds the ranks wait for each other (rendezvous, a collective) before giving up")
    g.add_argument("--no-pin-cores", dest="pin_cores", action="store_false",
                   help="leave the ranks' CPU affinity and thread counts alone (default: each rank pinned to its "
                        "share of the cores)")
    add_expert_parallel_arg(g)


def add_expert_parallel_arg(g) -> None:
    g.add_argument("--expert-parallel", action="store_true",
                   help="mixture-of-experts models: spread each sparse layer's experts over the ranks of a "
                        "distributed launch (contiguous blocks, uneven where the ranks do not divide them), routed "
                        "tokens exchanged with all-to-all; each rank loads only its experts")
    g.add_argument("--expert-parallel-size", type=positive_int, default=1, metavar="N",
                   help="expert parallelism over N ranks of its own, started like --tensor-parallel-size's (on one "
                        "machine ranks 1..N-1 pinned to their share of the cores; under torchrun one process per "
                        "rank): every layer whole on each rank but the experts, a contiguous block of E / N per rank "
                        "(the first E %% N ranks one more where N does not divide E; implies --expert-parallel)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    keys = ["dtype", "max_model_len", "device", "kv_cache_memory", "kv_cache_dtype", "kv_cache_dtype_k",
            "kv_cache_dtype_v", "kv_eviction", "kv_eviction_budget", "kv_sink_tokens", "kv_offload",
            "kv_offload_size", "kv_offload_path", "preemption_mode", "block_size", "enable_prefix_caching",
            "hybrid_kv_cache", "max_num_batched_tokens", "max_num_seqs", "seed", "quantization", "quant_group_size", "quant_symmetric",
            "speculative_method", "num_speculative_tokens", "speculative_controller", "draft_model",
            "draft_quantization", "rope_scaling", "speculative_layers"]
    parallel = ["tensor_parallel_size", "master_addr", "master_port", "dist_timeout", "pin_cores",
                "pipeline_parallel_size", "pipeline_microbatches", "internal_secret_file"]
    kw = {k: getattr(args, k) for k in keys} | {k: getattr(args, k) for k in parallel if hasattr(args, k)}
    kw |= {k: getattr(args, k) for k in ("enable_lora", "max_lora_rank") if hasattr(args, k)}  # set by bench lora
    if getattr(args, "expert_parallel", False):
        kw["expert_parallel"] = True
    if getattr(args, "expert_parallel_size", 1) > 1:
        kw["expert_parallel_size"] = args.expert_parallel_size
    return kw
