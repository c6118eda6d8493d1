"""The adapters an engine holds, and each step's per-row additions (the runner's `deltas` seam).

A step with adapter rows gets a delta(linear, x, y): each adapter row's y gains B (A x) on each piece's
columns. The pieces an adapter has on one Linear (q, k and v of qkv_proj; gate and up) share one shrink by
their A matrices stacked, then each expands its own share by its B (shrink then expand, as Punica's SGMV).
On a CPU every addition is kernels/lora_add.c, which computes each row alone in a fixed order: a row's result
is the same alone, beside other adapters' rows, or among any number of its own adapter's. The C decoder stack
gets the same tables as a descriptor (each row's adapter slot; per layer and linear, a table of each slot's
pieces) and calls the same code after each linear, so its layers equal the modules' bit for bit. Elsewhere
(CUDA) the additions are torch matmuls in the modules. A step without adapter rows runs as it always has."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu
from ridgeline.lora.adapter import Piece, map_adapter
from ridgeline.lora.peft_files import read_peft
from ridgeline.lora.request import LoRARequest


@dataclass
class _Expand:
    row: int  # first output column of the Linear it adds to
    rows: int
    rank: int
    roff: int  # its rank's columns in the shared shrink's output
    Bt: torch.Tensor  # [rank, rows], the entry's dtype
    scale: float  # times its share of the shrink, before the expand


@dataclass
class _Entry:
    """One adapter on one Linear: x [M, in] @ At [in, R] (the pieces' A stacked), then each piece's share of
    that times its Bt."""
    At: torch.Tensor  # bf16 where every tensor of the entry is stored bf16 (exact), else fp32
    pieces: list[_Expand]

    @property
    def rank(self) -> int:
        return self.At.shape[1]


HEAD_FIELDS, PIECE_FIELDS = 4, 6  # kernels/lora_add.c's LA_HEAD and LA_FIELDS: the tables _build_c_tables writes


class LoRAManager:
    def __init__(self, model: nn.Module, max_rank: int, device: torch.device):
        if getattr(model.model, "tp", None) is not None:
            raise InvalidRequestError("LoRA adapters do not run with tensor parallelism yet", "enable_lora")
        if getattr(model.model, "stage", None) is not None:
            raise InvalidRequestError("LoRA adapters do not run with pipeline parallelism yet", "enable_lora")
        self.model, self.max_rank, self.device = model, max_rank, device
        self.paths: dict[str, str] = {}  # name -> the folder it was read from
        self.layers: dict[str, dict[str, _Entry]] = {}  # Linear prefix -> adapter name -> its entry
        self.bytes: dict[str, int] = {}  # name -> bytes of its A and B as held
        self.slots: dict[str, int] = {}  # name -> its slot in the C descriptor (registration order)
        # Linear prefix -> its index in the C stack's [layers][4] tables (qkv, o, gate_up, down)
        self.c_index: dict[str, int] = {}
        for i, layer in enumerate(getattr(model.model, "layers", [])):
            sa, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            for j, lin in enumerate((getattr(sa, "qkv_proj", None), getattr(sa, "o_proj", None),
                                     getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None))):
                if lin is not None:
                    self.c_index[lin.prefix] = 4 * i + j
        self.tables: dict[str, torch.Tensor] = {}  # Linear prefix -> its kernels/lora_add.c table
        self.c_tables: torch.Tensor | None = None  # int64 [layers * 4] pointers to them, for the C stack
        self._c_keep: list[torch.Tensor] = []  # what the tables point at

    def knows(self, name: str) -> bool:
        return name in self.paths

    def register(self, req: LoRARequest) -> str:
        """Read, check and pack the adapter (once per name); returns its name. The same name again must name
        the same folder."""
        if req.name in self.paths:
            if self.paths[req.name] != req.path:
                raise InvalidRequestError(f"LoRA adapter {req.name!r} is already loaded from {self.paths[req.name]}",
                                          "lora_request")
            return req.name
        pieces = map_adapter(read_peft(req.name, req.path, self.max_rank), self.model, self.max_rank)
        self._pack(req.name, pieces)
        self.paths[req.name] = req.path
        self.slots[req.name] = len(self.slots)
        self._build_c_tables()
        return req.name

    def _pack(self, name: str, pieces: dict[str, list[Piece]]) -> None:
        total = 0
        for prefix, ps in pieces.items():
            dt = torch.bfloat16 if all(t.dtype == torch.bfloat16 for p in ps for t in (p.A, p.B)) else torch.float32
            At = torch.cat([p.A for p in ps]).T.to(dt).contiguous().to(self.device)
            roff, out = 0, []
            for p in ps:
                out.append(_Expand(p.row, p.rows, p.A.shape[0], roff, p.B.T.to(dt).contiguous().to(self.device),
                                   p.scale))
                roff += p.A.shape[0]
            self.layers.setdefault(prefix, {})[name] = _Entry(At, out)
            total += At.numel() * At.element_size() + sum(p.Bt.numel() * p.Bt.element_size() for p in out)
        self.bytes[name] = total

    @property
    def in_c(self) -> bool:
        """The additions run in kernels/lora_add.c (a CPU with the library), in the modules and the C stack alike."""
        return self.device.type == "cpu" and cpu.lib() is not None

    def _build_c_tables(self) -> None:
        """Per Linear, the table kernels/lora_add.c reads (every registered adapter's entry on it), and the C
        stack's [layers * 4] pointers to them; None without the library."""
        self.tables = {}
        if not self.in_c:
            self.c_tables = None
            return
        lib = cpu.lib()
        if (lib.ridgeline_lora_fields(0), lib.ridgeline_lora_fields(1)) != (HEAD_FIELDS, PIECE_FIELDS):
            raise RuntimeError("kernels/lora_add.c's table layout is not the one ridgeline/lora/manager.py writes")
        keep, tables = [], torch.zeros(max(self.c_index.values(), default=-1) + 1, dtype=torch.int64)
        for prefix, by_name in self.layers.items():
            per_slot = [0] * len(self.slots)
            for name, e in by_name.items():
                fields = [len(e.pieces), e.rank, e.At.data_ptr(), int(e.At.dtype == torch.bfloat16)]
                for p in e.pieces:
                    bits = int(torch.tensor([p.scale], dtype=torch.float32).view(torch.int32))
                    fields += [p.row, p.rows, p.rank, p.roff, p.Bt.data_ptr(), bits]
                t = torch.tensor(fields, dtype=torch.int64)
                keep.append(t)
                per_slot[self.slots[name]] = t.data_ptr()
            self.tables[prefix] = table = torch.tensor([len(self.slots), *per_slot], dtype=torch.int64)
            if prefix in self.c_index:
                tables[self.c_index[prefix]] = table.data_ptr()
        self._c_keep, self.c_tables = keep, tables if self.c_index else None

    def for_step(self, seqs) -> tuple[_StepDelta, torch.Tensor | None] | None:
        """The step's (delta, C stack descriptor or None), or None when no row runs under an adapter."""
        if not any(s.adapter for s in seqs):
            return None
        n = np.fromiter((s.num_new for s in seqs), np.int64, len(seqs))
        ends = np.cumsum(n)
        rows: dict[str, list[np.ndarray]] = {}
        for s, e, k in zip(seqs, ends, n):
            if s.adapter:
                rows.setdefault(s.adapter, []).append(np.arange(e - k, e))
        T = int(ends[-1])
        if not self.in_c:
            groups = []
            for name, parts in rows.items():
                idx = np.concatenate(parts)
                groups.append((name, slice(0, T) if len(idx) == T else torch.from_numpy(idx).to(self.device)))
            return _StepDelta(self.layers, groups), None
        slot_of = torch.full((T,), -1, dtype=torch.int64)
        for name, parts in rows.items():
            slot_of[torch.from_numpy(np.concatenate(parts))] = self.slots[name]
        delta = _CStepDelta(self.tables, slot_of)
        if self.c_tables is None:
            return delta, None
        delta.keep = self.c_tables  # alive while the step's context points at it
        return delta, torch.tensor([slot_of.data_ptr(), self.c_tables.data_ptr()], dtype=torch.int64)


class _CStepDelta:
    """delta(linear, x, y) for one step on a CPU: kernels/lora_add.c on the Linear's table, in place on y, as the
    C stack runs it. slot_of [T]: each row's adapter slot (-1: none)."""

    def __init__(self, tables: dict[str, torch.Tensor], slot_of: torch.Tensor):
        self.tables, self.slot_of = tables, slot_of
        self.keep = None

    def __call__(self, linear: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        table = self.tables.get(linear.prefix)
        if table is None:
            return y
        xf = x.float().contiguous()
        out = y if y.dtype == torch.float32 and y.is_contiguous() else y.float().contiguous()
        rc = cpu.lib().ridgeline_lora_add(table.data_ptr(), self.slot_of.data_ptr(), xf.data_ptr(), out.data_ptr(),
                                          x.shape[0], y.shape[1], x.shape[1], torch.get_num_threads())
        if rc:
            raise RuntimeError(f"LoRA additions failed ({rc}) on {linear.prefix}")
        return out if out is y else out.to(y.dtype)


class _StepDelta:
    """delta(linear, x, y) for one step elsewhere (CUDA, no library): torch matmuls, grouped by adapter."""

    def __init__(self, layers: dict[str, dict[str, _Entry]], groups: list[tuple[str, object]]):
        self.layers, self.groups = layers, groups

    def __call__(self, linear: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mine = self.layers.get(linear.prefix)
        if not mine:
            return y
        for name, sel in self.groups:
            e = mine.get(name)
            if e is None:
                continue
            sh = x[sel].float() @ e.At.float()
            for p in e.pieces:
                y[sel, p.row:p.row + p.rows] += ((sh[:, p.roff:p.roff + p.rank] * p.scale) @ p.Bt.float()).to(y.dtype)
        return y
