"""A sparse (mixture-of-experts) MLP: a router picks top_k of E experts per token (softmax, top-k,
the model's own renormalisation), each expert is a gated MLP, and Qwen2-MoE adds a shared expert
scaled by a sigmoid gate. Checkpoint names follow HF: `gate` (the router), `experts.{e}.*`,
`shared_expert.*`, `shared_expert_gate`. GPT-OSS: the router and the experts carry biases, the experts'
activation is the clamped SwiGLU, and its softmax over the top-k logits is the renormalised top-k of the
softmax (the same weights, one formula for every model).

Two paths with one contract (tokens grouped by expert, one matmul per expert over its tokens,
experts summed per token in ascending order, ties at the k-th place settled by torch.topk as in
transformers):
- C (kernels/moe.c), where the kernel plan has the fused ops and every expert's weight format has
  a C kernel: the same call the decoder stack makes, so the two are bitwise equal;
- torch otherwise (bf16 activations, no AVX-512): argsort by expert, a loop over experts (never
  over tokens).
`load_counts` [E] accumulates the (token, slot) pairs each expert received: the per-expert load
that expert placement reads; `touched` the experts that ran and the calls (weight bytes read).

Expert parallelism (an ExpertSharding as the build options' `experts`): this rank builds, loads and runs only
its block of experts (the sharding's placement; the others are absent from `experts`, a dict by
global id); the router and the shared expert are whole on every rank. The forward exchanges tokens
with the other ranks (the sharding's exchange); in the C stack the descriptor's dispatch
callback hands the layer to that same forward. The counters then hold the whole group's load.
"""
from __future__ import annotations

import torch
from torch import nn

from ridgeline.kernels import cpu, cpu_moe, cpu_stack
from ridgeline.layers.linear import Linear
from ridgeline.layers.mlp import MLP
from ridgeline.layers.weight_formats import DENSE, create_weight_format
from ridgeline.layers.build_options import BuildOptions
from ridgeline.layers.expert_compute import CExperts, TorchExperts
from ridgeline.weights.hf_config import MoEConfig


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, cfg: MoEConfig, opts: BuildOptions, prefix: str, index: int):
        super().__init__()
        self.index, self.num_experts, self.top_k = index, cfg.num_experts, cfg.top_k
        self.norm_topk, self.inter, self.shared_inter = cfg.norm_topk_prob, cfg.intermediate_size, \
            cfg.shared_intermediate_size
        router_format = create_weight_format(DENSE[opts.dtype], opts.plan)  # routers stay unquantized
        self.gate = Linear(hidden, cfg.num_experts, router_format, cfg.bias, opts.act_dtype, prefix=f"{prefix}.gate")
        self.ep = None
        self.act = cfg.activation
        # the experts' activation parameters for moe.c (fp32 [alpha, limit]; unused by SiLU)
        self.act_params = torch.tensor(cfg.act_params or (0.0, 0.0), dtype=torch.float32, device="cpu")

        def expert(e: int) -> MLP:
            return MLP(hidden, cfg.intermediate_size, opts, f"{prefix}.experts.{e}", cfg.activation, cfg.bias,
                       cfg.act_params)
        if opts.experts is None:
            self.experts = nn.ModuleList(expert(e) for e in range(cfg.num_experts))
        else:  # only this rank's experts: the checkpoint's other experts find no module and are skipped
            self.ep = opts.experts.exchange(cfg.num_experts)  # layers/expert_sharding.py ExpertExchange
            self.experts = nn.ModuleDict({str(e): expert(e) for e in self.ep.placement.local})
        self.shared_expert = self.shared_expert_gate = None
        if cfg.shared_intermediate_size:
            self.shared_expert = MLP(hidden, cfg.shared_intermediate_size, opts, f"{prefix}.shared_expert")
            self.shared_expert_gate = Linear(hidden, 1, router_format, prefix=f"{prefix}.shared_expert_gate")
        self.fused = opts.plan.fused_ops
        # tensor parallelism: the ranks' process group; each expert here is this rank's slice of its width
        # (its partial output summed by the layer's all-reduce). Expert placement distributes experts over it.
        self.group = getattr(opts.tp, "group", None)
        self._load: torch.Tensor | None = None  # int64 [E + 2]: per-expert pairs, experts run, calls
        self._desc: torch.Tensor | str | None = None  # built on first use, after the weights are packed
        self._scratch = torch.empty(0)
        self._dispatch = None  # the C callback of an expert-parallel layer, kept alive with the descriptor

    def expert_items(self) -> list[tuple[int, MLP]]:
        """(global expert id, module) of the experts this rank holds (all of them without expert parallelism)."""
        if isinstance(self.experts, nn.ModuleDict):
            return [(int(e), m) for e, m in self.experts.items()]
        return list(enumerate(self.experts))

    @property
    def load_counts(self) -> torch.Tensor:
        """int64 [E]: (token, slot) pairs routed to each expert since construction (or the last reset)."""
        return self._stats()[:self.num_experts]

    @property
    def touched(self) -> tuple[int, int]:
        """(experts that ran, summed over calls; calls): their mean is the experts read per step."""
        s = self._stats()
        return int(s[self.num_experts]), int(s[self.num_experts + 1])

    def reset_stats(self) -> None:
        self._stats().zero_()

    def expert_bytes(self) -> int:
        """Weight bytes of one expert as stored (gate_up + down)."""
        ex = self.expert_items()[0][1]
        return ex.gate_up_proj.format.weight_bytes(ex.gate_up_proj) + ex.down_proj.format.weight_bytes(ex.down_proj)

    def _stats(self) -> torch.Tensor:
        if self._load is None:
            self._load = torch.zeros(self.num_experts + 2, dtype=torch.int64)
        return self._load

    def linears(self) -> list[Linear]:
        """Router, shared expert (gate_up, down, gate) and every expert's (gate_up, down)."""
        out = [self.gate]
        if self.shared_expert is not None:
            out += [self.shared_expert.gate_up_proj, self.shared_expert.down_proj, self.shared_expert_gate]
        return out + [lin for _, ex in self.expert_items() for lin in (ex.gate_up_proj, ex.down_proj)]

    def c_descriptor(self) -> torch.Tensor | str:
        """The moe.c descriptor (int64), or why the C kernel cannot run this layer."""
        if self._desc is None:
            self._desc = self._build_descriptor()
        return self._desc

    def _build_descriptor(self) -> torch.Tensor | str:
        if not self.fused or cpu.lib() is None:
            return "the kernel plan has no fused C kernels on this machine"
        cpu_moe.check_layout()
        weights = {}
        for lin in self.linears():
            desc = lin.format.stack_weight(lin)
            if isinstance(desc, str):
                return f"{lin.prefix}: {desc}"
            if not cpu_stack.runs_weight_format(desc[0]):
                return f"{lin.prefix}: no C kernel for weight format {lin.format.name} on this CPU"
            if lin.bias is not None and (lin.bias.dtype != torch.float32 or not lin.bias.is_contiguous()):
                return f"{lin.prefix}: its bias is not fp32"
            weights[lin] = list(desc) + [0 if lin.bias is None else lin.bias.data_ptr()]
        zero = [0] * cpu_moe.WEIGHT_FIELDS
        act = {"silu": 0, "swiglu_clamp": 2}[self.act]
        row = [self.num_experts, self.top_k, self.inter, int(self.norm_topk), self.shared_inter,
               self._stats().data_ptr(), self._dispatch_pointer(), act, self.act_params.data_ptr()] + weights[self.gate]
        if self.shared_expert is not None:
            row += (weights[self.shared_expert.gate_up_proj] + weights[self.shared_expert.down_proj]
                    + weights[self.shared_expert_gate])
        else:
            row += zero * 3
        held = dict(self.expert_items())
        for e in range(self.num_experts):  # another rank's expert: an empty descriptor, never read
            ex = held.get(e)
            row += weights[ex.gate_up_proj] + weights[ex.down_proj] if ex is not None else zero * 2
        return torch.tensor(row, dtype=torch.int64)

    def _dispatch_pointer(self) -> int:
        """0, or (expert parallelism) the callback through which the C stack hands this layer to forward."""
        if self.ep is None:
            return 0
        import ctypes

        def call(layer, x_ptr, out_ptr, T, H):
            try:
                x = torch.frombuffer((ctypes.c_float * (T * H)).from_address(x_ptr), dtype=torch.float32)
                out = torch.frombuffer((ctypes.c_float * (T * H)).from_address(out_ptr), dtype=torch.float32)
                out.view(T, H).copy_(self.forward(x.view(T, H)))
                return 0
            except Exception:  # never unwind through C; the step fails with a clear error instead
                import logging
                logging.getLogger(__name__).exception("expert-parallel MoE layer %d failed", layer)
                return -6
        self._dispatch = cpu_moe.DISPATCH(call)
        return ctypes.cast(self._dispatch, ctypes.c_void_p).value

    def scratch_for(self, T: int, H: int) -> torch.Tensor:
        need = cpu_moe.scratch_floats(self.c_descriptor(), T, H)
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need)
        return self._scratch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]"""
        if self.ep is not None:
            fast = x.dtype == torch.float32 and not isinstance(self.c_descriptor(), str)
            compute = CExperts(self._desc, self.index) if fast else TorchExperts(self)
            return self.ep.forward_replicated(compute, x, self._stats())
        if x.dtype == torch.float32 and x.is_contiguous() and not isinstance(self.c_descriptor(), str):
            return cpu_moe.run(self._desc, x, self.index, self.scratch_for(*x.shape))
        return self._torch_forward(x)

    def _torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, idx = torch.topk(probs, self.top_k, dim=-1)  # [T, k], largest first
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert, tokens ascending
        counts = torch.bincount(flat, minlength=self.num_experts)
        stats = self._stats()
        stats[:self.num_experts] += counts
        stats[self.num_experts] += int((counts > 0).sum())
        stats[self.num_experts + 1] += 1
        tokens, w = order // self.top_k, weights.flatten()[order].to(x.dtype)
        out = torch.zeros_like(x)
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                rows = tokens[start:start + n]
                out.index_add_(0, rows, self.experts[e](x[rows]) * w[start:start + n, None])
                start += n
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


def unread_expert_bytes(model: nn.Module) -> int:
    """Weight bytes a token's decode step does not read: in each sparse layer, all but top_k of the experts
    this process holds (their mean size: a GGUF file may store experts of one layer alike)."""
    out = 0
    for m in model.modules():
        if isinstance(m, SparseMoE):
            held = m.expert_items()
            if len(held) > m.top_k:
                size = sum(lin.format.weight_bytes(lin) for _, ex in held for lin in (ex.gate_up_proj, ex.down_proj))
                out += size * (len(held) - m.top_k) // len(held)
    return out
