"""The KV cache spec: formats of K and V, bytes per token (scales included), block layout. Owned
here, once; the engine's capacity, the advisor's KV arithmetic and the runner's allocation all read
it. Torch-free (the KV manager and scheduler import it)."""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.kv_groups import KVGroups


@dataclass(frozen=True)
class KVFormat:
    name: str
    element_bytes: float  # per K or V element
    scale_bytes: int = 0  # per scale, for quantized formats (fp16 scales: 2)
    group: int = 0  # elements per scale along the head dimension; 0: one scale per (token, KV head) vector
    rotate: bool = False  # stored after a normalized Hadamard transform along the head dimension
    # as K: stored minus a per-(layer, KV head, channel) center measured at start-up (layers/kv_cache.py
    # k_centers; the key at position 0 minus one of its own, which attention adds back); every score of a
    # query moves by the same amount, which softmax ignores
    center: bool = False

    @property
    def quantized(self) -> bool:
        return self.scale_bytes > 0

    def scales_per_vector(self, head_dim: int) -> int:
        if not self.quantized:
            return 0
        return head_dim // self.group if self.group else 1

    def data_units(self, head_dim: int) -> int:
        """Storage elements of one head vector: head_dim, or bytes for sub-byte formats."""
        return int(head_dim * self.element_bytes) if self.element_bytes < 1 else head_dim

    def vector_bytes(self, head_dim: int) -> int:
        """Bytes of one (token, KV head) vector, its scales included."""
        return int(head_dim * self.element_bytes) + self.scales_per_vector(head_dim) * self.scale_bytes

    def unsupported(self, head_dim: int) -> str | None:
        """Why this format cannot store vectors of head_dim, or None."""
        if self.group and head_dim % self.group:
            return f"{self.name} quantizes groups of {self.group} along the head dimension; head_dim is {head_dim}"
        if self.rotate and ((head_dim & -head_dim) < 16 or head_dim > 1024):
            return f"{self.name} rotates blocks of 16+ elements (a power of two dividing head_dim {head_dim}), " \
                   "head_dim up to 1024"
        return None


KV_FORMATS = {f.name: f for f in (
    KVFormat("f32", 4), KVFormat("bf16", 2), KVFormat("f16", 2),
    KVFormat("int8", 1, 2),  # symmetric, an fp16 scale per (token, KV head): amax / 127
    KVFormat("int4", 0.5, 2, 32, rotate=True, center=True),  # K centered, Hadamard-rotated, symmetric groups
    # of 32, fp16 scales (each group the best of four, formats/kv.py)
    KVFormat("fp8_e4m3", 1, 2),  # an fp16 scale per (token, KV head) from the data: amax -> 448
    KVFormat("fp8_e5m2", 1, 2),  # the same, amax -> 256 (the scale stays a normal fp16 number)
)}

# what users write (--kv-cache-dtype) -> a KV_FORMATS name; "auto" keeps the model's dtype
KV_CACHE_DTYPES = {"auto": None, "float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "int8",
                   "int4": "int4", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
_MODEL_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def check_kv_cache_dtype(value: str | None, field: str, optional: bool = False) -> None:
    """Raise ValueError naming the choices unless value is a KV_CACHE_DTYPES key (or None where optional)."""
    if value is None and optional:
        return
    if value not in KV_CACHE_DTYPES:
        raise ValueError(f"{field} must be one of {', '.join(KV_CACHE_DTYPES)}, got {value!r}")


def kv_formats(k_dtype: str, v_dtype: str, model_dtype: str, head_dim: int) -> tuple[KVFormat, KVFormat]:
    """(K format, V format) for the chosen --kv-cache-dtype(-k/-v) values ("auto": the model's dtype,
    a torch dtype name) and the model's head_dim; ValueError if a format cannot store its vectors."""
    out = []
    for value in (k_dtype, v_dtype):
        fmt = KV_FORMATS[KV_CACHE_DTYPES[value] or _MODEL_DTYPES[model_dtype]]
        why = fmt.unsupported(head_dim)
        if why:
            ok = [d for d, n in KV_CACHE_DTYPES.items() if n and not KV_FORMATS[n].unsupported(head_dim)]
            raise ValueError(f"kv_cache_dtype {value}: {why}; this model takes {', '.join(ok)}")
        out.append(fmt)
    return out[0], out[1]


@dataclass(frozen=True)
class KVCacheSpec:
    format: KVFormat  # K's format
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    v_format: KVFormat | None = None  # None: the same as K's
    layout: str = ("per layer, for K then V: data [blocks, block_size, kv_heads, head_dim units], then "
                   "scales [blocks, block_size, kv_heads, scales per vector] fp16 for quantized formats")
    # KV groups (ridgeline/kv_groups.py): a page holds groups.size layers' regions, not num_layers'
    groups: KVGroups | None = None

    def __post_init__(self):
        if self.v_format is None:
            object.__setattr__(self, "v_format", self.format)

    @property
    def k_format(self) -> KVFormat:
        return self.format

    @property
    def storage_layers(self) -> int:
        """Layers' regions in one block (a page): every layer's, or a KV group's."""
        return self.groups.size if self.groups is not None else self.num_layers

    @property
    def bytes_per_token(self) -> int:
        """Every layer's K and V of one token."""
        return self.num_layers * self._layer_token_bytes

    @property
    def _layer_token_bytes(self) -> int:
        return self.num_kv_heads * (self.format.vector_bytes(self.head_dim) + self.v_format.vector_bytes(self.head_dim))

    @property
    def bytes_per_block(self) -> int:
        """One block (a page: storage_layers' regions) of block_size tokens."""
        return self.storage_layers * self._layer_token_bytes * self.block_size

    def region_shapes(self, num_blocks: int) -> dict[str, tuple[tuple[int, ...], KVFormat | None]]:
        """Name -> (shape, format) of each region of one layer, in storage order; a scale region's format is None."""
        lead, D = (num_blocks, self.block_size, self.num_kv_heads), self.head_dim
        out = {}
        for side, fmt in (("k", self.format), ("v", self.v_format)):
            out[side] = (lead + (fmt.data_units(D),), fmt)
            if fmt.quantized:
                out[f"{side}_scale"] = (lead + (fmt.scales_per_vector(D),), None)
        return out

    def num_blocks(self, kv_bytes: int) -> int:
        """Blocks that kv_bytes hold, plus block 0 (reserved: padded block tables point at it)."""
        return kv_bytes // self.bytes_per_block + 1

    @property
    def format_names(self) -> str:
        k, v = self.format.name, self.v_format.name
        return k if k == v else f"K {k}, V {v}"

    def describe(self) -> str:
        return f"{self.format_names}, {self.bytes_per_token} B/token"
