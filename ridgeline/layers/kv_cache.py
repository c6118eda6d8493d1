"""One layer's view of the paged KV cache, and the one place KV is written from Python.

The cache of all layers is one allocation laid out as the engine's KVCacheSpec says
(ridgeline/kv_spec.py): per layer (per region of a page, with KV groups), K data, K scales (quantized formats), V data, V scales; each
attention layer holds a LayerKV over its regions. Writes go through `write` (torch, quantizing with
ridgeline/formats/kv.py) or `write_rope` (rotary + quantize + write in one C pass, kernels/ops.c); the C
decoder stack calls that same C function.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ridgeline.kernels import cpu_ops
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec, KVFormat
from ridgeline.formats import kv as kvq

# what the C kernels read and write (paged_attention.c, ops.c: enum kv_format); a layer passes
# k_code | v_code << 8
C_KV_FORMATS = {"f32": 0, "bf16": 1, "f16": 2, "int8": 3, "int4": 4, "fp8_e4m3": 5, "fp8_e5m2": 6}


def allocate_kv(spec: KVCacheSpec, num_blocks: int, device: torch.device) -> list[LayerKV]:
    """Every layer's regions in one zero-filled allocation: never-written slots must hold finite values
    (a masked key still multiplies its V by 0; a zero scale dequantizes to 0). On a CPU, zero pages mapped
    on first touch, on huge pages; every region starts 64-byte aligned."""
    from ridgeline.utils import hugepages
    regions = spec.region_shapes(num_blocks)
    sizes = {}
    for name, (shape, fmt) in regions.items():
        dtype = torch.float16 if fmt is None else kvq.storage_dtype(fmt)
        sizes[name] = (shape, dtype, -(-_numel(shape) * dtype.itemsize // 64) * 64)
    per_layer = sum(n for _, _, n in sizes.values())
    total = per_layer * spec.storage_layers
    if device.type == "cpu":
        buf = torch.from_numpy(hugepages.zeroed(total))
    else:
        buf = torch.zeros(total, dtype=torch.uint8, device=device)
    stores, off = [], 0
    for _ in range(spec.storage_layers):
        views = {}
        for name, (shape, dtype, nbytes) in sizes.items():
            views[name] = buf[off:off + _numel(shape) * dtype.itemsize].view(dtype).view(shape)
            off += nbytes
        stores.append(views)
    g = spec.groups  # KV groups: layer l's pages are its group's, its region slot[l] of each
    layers = []
    for i in range(spec.num_layers):
        views = stores[g.slot[i] if g is not None else i]
        centers = torch.zeros(3, spec.num_kv_heads, spec.head_dim, device=device) if spec.format.center else None
        layers.append(LayerKV(views["k"], views["v"], spec.format.name, spec.v_format.name,
                              views.get("k_scale"), views.get("v_scale"), centers, g.group[i] if g is not None else 0))
    return layers


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass
class LayerKV:
    k: torch.Tensor  # [NB, bs, Hkv, units] data (units: head_dim, or bytes for int4)
    v: torch.Tensor  # [NB, bs, Hkv, units]
    format: str  # K's KV_FORMATS name
    v_format: str | None = None  # V's; None: the same as K's
    k_scale: torch.Tensor | None = None  # [NB, bs, Hkv, scales per vector] fp16, quantized K only
    v_scale: torch.Tensor | None = None
    # [3, Hkv, D] fp32, K formats with `center` (set once at start-up by engine/kv_centers.py through
    # set_centers, before any block is kept): [0] `k_shift`, subtracted from every k before it is stored
    # (softmax ignores a shift common to a query's keys); [1] subtracted instead from the k at position 0
    # (the attention sink: its key lies far from the others', so one center cannot serve both); [2]
    # `k0_offset` = [1] - [0] in K's stored basis, added back to the key at position 0 when it is read,
    # so that every key of a query is shifted alike
    k_centers: torch.Tensor | None = None
    kv_group: int = 0  # the KV group whose block tables address this layer's pages (ridgeline/kv_groups.py)

    def __post_init__(self):
        if self.v_format is None:
            self.v_format = self.format

    @property
    def k_shift(self) -> torch.Tensor | None:
        return None if self.k_centers is None else self.k_centers[0]

    @property
    def k0_offset(self) -> torch.Tensor | None:
        return None if self.k_centers is None else self.k_centers[2]

    def set_centers(self, shift: torch.Tensor, sink: torch.Tensor) -> None:
        """shift, sink [Hkv, D]: the centers of keys at positions > 0 and at position 0."""
        d = (sink - shift).to(torch.float32)
        self.k_centers.copy_(torch.stack((shift, sink, kvq.hadamard(d) if self.k_fmt.rotate else d)))

    @property
    def k_fmt(self) -> KVFormat:
        return KV_FORMATS[self.format]

    @property
    def v_fmt(self) -> KVFormat:
        return KV_FORMATS[self.v_format]

    @property
    def block_size(self) -> int:
        return self.k.shape[1]

    @property
    def formats(self) -> str:
        return self.format if self.format == self.v_format else f"K {self.format} / V {self.v_format}"

    @property
    def c_format(self) -> int | None:
        """The C kernels' code for this cache (k | v << 8), or None where they cannot read it."""
        ok = self.k.device.type == "cpu" and all(t is None or t.is_contiguous()
                                                 for t in (self.k, self.v, self.k_scale, self.v_scale))
        k, v = C_KV_FORMATS.get(self.format), C_KV_FORMATS.get(self.v_format)
        return k | v << 8 if ok and k is not None and v is not None else None

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor | None = None) -> None:
        """k, v [T, Hkv, D] at positions [T] (None: none is position 0) into flat slots [T], quantized to this
        cache's formats."""
        if self.k_centers is not None:
            first = torch.zeros(len(k), dtype=torch.bool, device=k.device) if positions is None else positions == 0
            k = k - torch.where(first.view(-1, 1, 1), self.k_centers[1], self.k_centers[0])
        _store(self.k, self.k_scale, self.k_fmt, slots, k)
        _store(self.v, self.v_scale, self.v_fmt, slots, v)

    def write_rope(self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, slots: torch.Tensor,
                   H: int, Hkv: int, D: int) -> None:
        """qkv [T, (H + 2 Hkv) D] fp32: q and k rotated in place, k and v written at slots (C)."""
        cpu_ops.rope_kv(qkv, positions, cos_sin, slots, self.k, self.v, H, Hkv, D, self.c_format,
                        self.k_scale, self.v_scale, self.k_centers)

    def read(self, blocks: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the given blocks [n] dequantized: [n, bs, Hkv, D] each (rotated formats stay rotated)."""
        return (kvq.dequantize(self.k_fmt, self.k.index_select(0, blocks), _select(self.k_scale, blocks), dtype),
                kvq.dequantize(self.v_fmt, self.v.index_select(0, blocks), _select(self.v_scale, blocks), dtype))


def move_slots(layers: list[LayerKV], moves: list[tuple[int, int]]) -> None:
    """Copy K, V (and scales) of flat slot `from` to slot `to`, in every layer, for each (from, to) pair;
    no slot is both a source and a destination."""
    device = layers[0].k.device
    src = torch.tensor([a for a, _ in moves], dtype=torch.long, device=device)
    dst = torch.tensor([b for _, b in moves], dtype=torch.long, device=device)
    for kv in layers:
        for t in (kv.k, kv.v, kv.k_scale, kv.v_scale):
            if t is not None:
                flat = t.view(-1, *t.shape[2:])
                flat.index_copy_(0, dst, flat.index_select(0, src))


def _select(scale: torch.Tensor | None, blocks: torch.Tensor) -> torch.Tensor | None:
    return None if scale is None else scale.index_select(0, blocks)


def _store(data: torch.Tensor, scale: torch.Tensor | None, fmt: KVFormat, slots: torch.Tensor,
           x: torch.Tensor) -> None:
    T, Hkv, D = x.shape
    q, s = kvq.quantize(fmt, x.reshape(T * Hkv, D))
    data.view(-1, Hkv, data.shape[-1]).index_copy_(0, slots, q.view(T, Hkv, -1))
    if scale is not None:
        scale.view(-1, Hkv, scale.shape[-1]).index_copy_(0, slots, s.view(T, Hkv, -1))
