"""`ridgeline quantize`: a Hugging Face folder -> an int4 folder in a hub layout, with the method recorded.

    rtn    round-to-nearest, written in GPTQ's layout (quant_method "gptq", method "rtn")
    gptq   gptq.py on each projection, with the Hessian of its input; GPTQ's layout
    awq    scales folded into the op before each group of projections (q/k/v and gate/up searched on
           their block's output, awq_block.py; o and down on their own, awq.py), then rounded on
           clipped grids (clip.py); AutoAWQ's GEMM layout

gptq and awq calibrate sequentially (sequential.py): layer i's statistics come from the calibration
text run through layers 0..i-1 as already quantized, so each layer is fitted to the inputs the
quantized model gives it. (Statistics passed in instead are used as they are, for every layer at
once: the one-pass ablation.)

The projections of every decoder layer (q, k, v, o, gate, up, down) are quantized; embeddings, norms
and the LM head stay as they were (the engine gives the head int8 at load, as with --quantization
int4). config.json gains `quantization_config`, which the engine reads at load.
"""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ridgeline.errors import InvalidRequestError
from ridgeline.quant import awq, awq_block, calibrate, clip, gptq, sequential
from ridgeline.quant.choices import BITS, METHODS
from ridgeline.formats import grid, hub_layout
from ridgeline.weights.quant_checkpoint import read_quant_config

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ATTN_INPUT = ("q_proj", "k_proj", "v_proj")  # the projections of the attention's input (qkv_proj)
ENGINE_LINEAR = {"q_proj": "self_attn.qkv_proj", "k_proj": "self_attn.qkv_proj", "v_proj": "self_attn.qkv_proj",
                 "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_up_proj", "up_proj": "mlp.gate_up_proj",
                 "down_proj": "mlp.down_proj"}


@dataclass(frozen=True)
class QuantizeOptions:
    method: str = "gptq"
    bits: int = 4
    group_size: int = 128
    symmetric: bool = False
    act_order: bool = False
    calibration: str | None = None  # a text file; None: the shipped calibration part; "none": no text
    calibration_tokens: int = calibrate.DEFAULT_TOKENS
    damp: float = gptq.DAMP
    awq_duo: bool = False  # awq: also score s = mean|x|^a / mean|w|^(1-a) per group (awq.best_scale)
    awq_refine: float = 0.0  # awq: also score the best alpha -/+ this (awq.best_scale)
    awq_score_tokens: int = awq_block.SCORE_TOKENS  # awq: calibration tokens the block search scores on

    def check(self) -> None:
        if self.method not in METHODS:
            raise InvalidRequestError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}", "method")
        if self.bits not in BITS:
            raise InvalidRequestError(f"bits must be one of {', '.join(map(str, BITS))} (the engine's int4 "
                                      f"kernels), got {self.bits}", "bits")
        grid.check_group(self.group_size, self.group_size)  # the group size alone: one of the int4 sizes
        if self.awq_duo and self.method != "awq":
            raise InvalidRequestError(f"--awq-duo applies to awq only (method is {self.method})", "awq_duo")
        if self.act_order and self.method != "gptq":
            raise InvalidRequestError(f"--act-order applies to gptq only (method is {self.method})", "act_order")
        if self.method != "rtn" and self.calibration == "none":
            raise InvalidRequestError(f"{self.method} needs calibration text: give --calibration FILE or leave it "
                                      "out for the shipped calibration part (only rtn runs without)", "calibration")


def quantize_folder(src: Path, out: Path, opts: QuantizeOptions, progress: bool = True,
                    stats: dict[str, calibrate.InputStats] | None = None) -> dict:
    """Quantize the model folder src into out (a new or empty folder); returns the quantization_config.
    stats: calibrate.capture's one-pass statistics of the float model, to use for every layer instead
    of sequential calibration (an ablation; one capture serves every method and group size)."""
    from ridgeline.weights.hf_config import load_arch_config
    from ridgeline.models.loader import folder_tensors
    opts.check()
    existing = read_quant_config(src)
    if existing is not None:
        raise InvalidRequestError(f"{src} is already quantized ({existing.method}, quantization_config in "
                                  "config.json): quantize its unquantized original instead", "model")
    if out.exists() and any(out.iterdir()):
        raise InvalidRequestError(f"--out {out} exists and is not empty", "out")
    arch = load_arch_config(src)
    for K in (arch.hidden_size, arch.intermediate_size, arch.num_heads * arch.head_dim):
        grid.check_group(K, opts.group_size)
    text, source = (None, None)
    if opts.method != "rtn":
        text, source = calibrate.calibration_text(opts.calibration)
    tensors = {name: t for name, t in folder_tensors(src, arch)}
    if opts.method == "rtn" or stats is not None:
        stats = stats or {}
        with one_thread():
            out_tensors = _quantize_tensors(tensors, stats, arch, opts, progress)
        tokens = sum(s.rows for s in stats.values()) // max(len(stats), 1)
    else:
        out_tensors, tokens = _quantize_sequential(src, tensors, arch, opts, text, progress)
    qc = quantization_config(opts, source, tokens, sequential=stats is None)
    _write(src, out, out_tensors, qc)
    return qc


def _quantize_tensors(tensors: dict, stats: dict, arch, opts: QuantizeOptions, progress: bool) -> dict:
    """One pass (rtn, or statistics given): every projection packed in the method's layout, the rest as it is."""
    stats = dict(stats)  # awq replaces a folded layer's entry (its input is scaled)
    if opts.method == "awq":
        for i in tqdm(range(arch.num_layers), desc="awq scales", unit="layer", leave=False, disable=not progress):
            fold_awq_layer(tensors, stats, arch, opts, i)
    out_tensors = {n: t.contiguous() for n, t in tensors.items() if not _is_projection(n)}
    names = [n for n in tensors if _is_projection(n)]
    for name in tqdm(names, desc=f"{opts.method} int4", unit="layer", disable=not progress):
        out_tensors.update(_quantize_packed(name, tensors[name], stats, opts)[0])
    return out_tensors


def _quantize_sequential(src: Path, tensors: dict, arch, opts: QuantizeOptions, text: str,
                         progress: bool) -> tuple[dict, int]:
    """gptq / awq layer by layer, each calibrated on the outputs of the layers already quantized
    (sequential.py); returns the output tensors and the calibration tokens used."""
    runner = sequential.LayerRunner(src, text, opts.calibration_tokens, progress=progress)
    out_tensors: dict[str, torch.Tensor] = {}

    def quantize_layer(i: int, stats: dict) -> dict:
        prefix = f"model.layers.{i}."
        before = {n: t for n, t in tensors.items() if n.startswith(prefix)}
        with one_thread():
            if opts.method == "awq":
                scorer = awq_block.BlockScorer(runner, i, opts.group_size, opts.symmetric, opts.awq_score_tokens)
                fold_awq_layer(tensors, stats, arch, opts, i, scorer)
            live = {}
            for name in [n for n in tensors if n.startswith(prefix) and _is_projection(n)]:
                packed, live[name] = _quantize_packed(name, tensors[name], stats, opts)
                out_tensors.update(packed)
        live.update({n: t for n, t in tensors.items() if n.startswith(prefix) and not _is_projection(n)
                     and t is not before.get(n)})  # norms (and biases) AWQ folded a scale into
        return live

    try:
        sequential.run_layers(runner, arch.num_layers, quantize_layer, f"{opts.method} int4 (sequential)")
    finally:
        runner.close()
    out_tensors.update({n: t.contiguous() for n, t in tensors.items() if not _is_projection(n)})
    return out_tensors, runner.tokens


def _quantize_packed(name: str, W: torch.Tensor, stats: dict, opts: QuantizeOptions) -> tuple[dict, torch.Tensor]:
    """(the projection's tensors in the method's hub layout, the float values they dequantize to)."""
    prefix = name.removesuffix(".weight")
    q, g, g_idx = _quantize_one(W, stats.get(_engine_name(prefix)), opts, prefix.endswith(ATTN_INPUT))
    packed = (hub_layout.pack_awq(q, g.scale, g.zero) if opts.method == "awq"
              else hub_layout.pack_gptq(q, g.scale, g.zero, g_idx, opts.group_size))
    values = (gptq.Quantized(q, g, g_idx).dequantize(opts.group_size))
    return {f"{prefix}.{k}": v for k, v in packed.items()}, values


@contextmanager
def one_thread():
    """torch on one thread for the duration: GPTQ's column loop and AWQ's search are thousands of small
    ops, where fork-joins cost more than they save (measured 10x slower wall time on 2 threads of a
    busy 2-CPU machine: 12.9 s against 1.4 s for one 576 x 576 layer)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _quantize_one(W: torch.Tensor, st: calibrate.InputStats | None, opts: QuantizeOptions, attention: bool):
    """attention: W is q, k or v (GPTQ's Hessian weighs the attention-sink tokens, calibrate.py)."""
    if opts.method == "gptq":
        r = gptq.quantize(W, st.hessian(attention), opts.group_size, opts.symmetric, opts.act_order, opts.damp)
        return r.q, r.grid, r.g_idx
    if opts.method == "awq":
        g = clip.fit_clipped(W, st.gram, opts.group_size, opts.symmetric)
    else:
        g = grid.fit_groups(W.float(), opts.group_size, opts.symmetric)
    return g.quantize(W.float(), opts.group_size), g, None


def fold_awq_layer(tensors: dict, stats: dict, arch, opts: QuantizeOptions, i: int, scorer=None) -> None:
    """Search each group's scale in layer i and fold it in place: the input's producer divided, the layers
    multiplied (stats: engine Linear prefix -> its input statistics; a folded group's entry is replaced by
    its scaled input's, which the clipping search of the same layers then reads). scorer: an
    awq_block.BlockScorer of layer i, which scores the groups it knows on their block's output."""
    p = f"model.layers.{i}"
    groups = [(f"{p}.input_layernorm.weight", [f"{p}.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")],
               f"{p}.self_attn.qkv_proj"),
              (f"{p}.self_attn.v_proj", [f"{p}.self_attn.o_proj"], f"{p}.self_attn.o_proj"),
              (f"{p}.post_attention_layernorm.weight", [f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"],
               f"{p}.mlp.gate_up_proj"),
              (f"{p}.mlp.up_proj", [f"{p}.mlp.down_proj"], f"{p}.mlp.down_proj")]
    for producer, layers, engine_name in groups:
        st = stats[engine_name]
        weights = [tensors[f"{n}.weight"].float() for n in layers]
        tie = _v_channel_of_o_column(arch) if layers[0].endswith("o_proj") else None
        mean_abs = st.mean_abs if tie is None else _tied_mean(st.mean_abs, tie)
        w_mag = awq.weight_magnitude(weights, opts.group_size) if opts.awq_duo else None
        if w_mag is not None and tie is not None:  # tied columns must get one scale
            w_mag = _tied_mean(w_mag, tie)
        if scorer is not None and scorer.scores(engine_name):
            s, _, _ = scorer.search(engine_name, {f"{n}.weight": w for n, w in zip(layers, weights)}, mean_abs,
                                    w_mag=w_mag, refine=opts.awq_refine)
        else:
            s, _ = awq.search_scale(weights, st.gram, mean_abs, opts.group_size, opts.symmetric, w_mag=w_mag,
                                    refine=opts.awq_refine)
        for n, w in zip(layers, weights):
            tensors[f"{n}.weight"] = w * s[None, :]
        stats[engine_name] = st.scaled(s)  # the layers' input is now x / s
        if tie is not None:  # one scale per v row: the o columns of every query head sharing that KV head
            s = s[_first_column_of_v_channel(tie)]
        if producer.endswith("norm.weight"):
            tensors[producer] = tensors[producer].float() / s
        else:  # a projection: its output rows (and bias)
            tensors[f"{producer}.weight"] = tensors[f"{producer}.weight"].float() / s[:, None]
            if f"{producer}.bias" in tensors:
                tensors[f"{producer}.bias"] = tensors[f"{producer}.bias"].float() / s


def _v_channel_of_o_column(arch) -> torch.Tensor:
    """o_proj input column (query head h, dim d) -> the v_proj output row it reads: (h // rep, d), rep query
    heads sharing a KV head as grouped-query attention repeats them. A scale on v's row then divides every
    one of those o columns' inputs alike, so the o columns' scales are tied to it."""
    rep, d = arch.num_heads // arch.num_kv_heads, arch.head_dim
    return ((torch.arange(arch.num_heads) // rep)[:, None] * d + torch.arange(d)[None, :]).flatten()


def _tied_mean(mean_abs: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """Each column's activation magnitude replaced by the mean over the columns tied to the same v row."""
    n = int(tie.max()) + 1
    total = torch.zeros(n, dtype=mean_abs.dtype).index_add_(0, tie, mean_abs)
    count = torch.zeros(n, dtype=mean_abs.dtype).index_add_(0, tie, torch.ones_like(mean_abs))
    return (total / count)[tie]


def _first_column_of_v_channel(tie: torch.Tensor) -> torch.Tensor:
    first = torch.full((int(tie.max()) + 1,), len(tie), dtype=torch.long)
    return first.scatter_reduce(0, tie, torch.arange(len(tie)), "amin")


def quantization_config(opts: QuantizeOptions, source: str | None, tokens: int, sequential: bool = True) -> dict:
    common = {"bits": opts.bits, "group_size": opts.group_size, "method": opts.method, "symmetric": opts.symmetric,
              "calibration": source, "calibration_tokens": tokens if source else 0,
              "sequential": bool(source) and sequential}
    if opts.method == "awq":
        search = {"awq_duo": opts.awq_duo, "awq_refine": opts.awq_refine, "awq_score_tokens": opts.awq_score_tokens}
        return {"quant_method": "awq", "version": "gemm", "zero_point": not opts.symmetric, **search, **common}
    return {"quant_method": "gptq", "sym": opts.symmetric, "desc_act": opts.act_order, "static_groups": False,
            "true_sequential": False, "damp_percent": opts.damp, "checkpoint_format": "gptq", **common}


def _is_projection(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in ATTN + MLP and ".layers." in name


def _engine_name(prefix: str) -> str:
    head, _, proj = prefix.rpartition(".")
    return f"{head.rpartition('.')[0]}.{ENGINE_LINEAR[proj]}"


def _write(src: Path, out: Path, tensors: dict, qc: dict) -> None:
    from safetensors.torch import save_file
    from ridgeline.gguf.source import SOURCE_FILE  # a GGUF model's link to its file: the output has weights
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json",
                                                                       SOURCE_FILE):
            shutil.copy2(f, out / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
