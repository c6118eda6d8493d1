"""RoPE scaling: the inverse frequencies (and the attention factor) of each kind a config or the
`--rope-scaling` override may name, as transformers' rope init functions compute them.

- linear: every frequency / factor (position interpolation).
- dynamic: NTK-aware: theta' = theta (factor L / L0 - (factor - 1))^(D / (D - 2)) with L the engine's
  max_model_len (at least L0). transformers recomputes it from the current length at every forward,
  which would change the rotation of K already cached; here it is computed once for max_model_len
  (what transformers uses for a sequence of that length), the same for every position.
- yarn: frequencies blended between interpolated and original by a ramp over dimensions (beta_fast,
  beta_slow), and q and k scaled by the attention factor (0.1 ln(factor) + 1 by default, or from
  mscale / mscale_all_dim, or given).
- llama3: long wavelengths / factor, short ones kept, a smooth blend between.
- longrope (Phi-3.5, Phi-4-mini; from a config only): each frequency divided by its own factor, the
  `long_factor` list when max_model_len is past L0, else `short_factor`, chosen once for the engine's
  length as llama.cpp does (transformers switches per forward, which would re-rotate cached keys), and
  q and k scaled by sqrt(1 + ln(factor) / ln(L0)) unless `attention_factor` is given.
L0 is `original_max_position_embeddings`, the model's max_position_embeddings when not given.
"""
# torch is imported inside the functions that compute: the config validates overrides with this
# module and stays torch-free
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from ridgeline.errors import InvalidRequestError, UnsupportedArchitectureError

if TYPE_CHECKING:
    import torch

KINDS = ("linear", "dynamic", "yarn", "llama3")
_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "attention_factor",
            "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def kind_of(scaling: dict) -> str:
    return scaling.get("rope_type", scaling.get("type", "default"))


def parse_override(text: str) -> dict:
    """`--rope-scaling` JSON -> a checked dict (rope_type spelled out); a clear error otherwise."""
    try:
        d = json.loads(text) if isinstance(text, str) else dict(text)
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise InvalidRequestError(f"rope_scaling must be a JSON object such as "
                                  f'{{"rope_type": "yarn", "factor": 4}}: {e}', "rope_scaling") from None
    if not isinstance(d, dict):
        raise InvalidRequestError("rope_scaling must be a JSON object", "rope_scaling")
    d = {("rope_type" if k == "type" else k): v for k, v in d.items()}
    kind = d.get("rope_type")
    if kind not in KINDS:
        raise InvalidRequestError(f"rope_scaling rope_type {kind!r} is not supported; supported: {', '.join(KINDS)}",
                                  "rope_scaling")
    missing = [k for k in _REQUIRED[kind] if k not in d]
    if missing:
        raise InvalidRequestError(f"rope_scaling {kind} needs {', '.join(missing)}", "rope_scaling")
    for k in _NUMBERS:
        if k in d and (isinstance(d[k], bool) or not isinstance(d[k], (int, float)) or not d[k] > 0):
            raise InvalidRequestError(f"rope_scaling {k} must be a positive number, got {d[k]!r}", "rope_scaling")
    if d["factor"] < 1:
        raise InvalidRequestError(f"rope_scaling factor must be >= 1, got {d['factor']}", "rope_scaling")
    unknown = set(d) - set(_NUMBERS) - {"rope_type", "truncate"}
    if unknown:
        raise InvalidRequestError(f"rope_scaling: unknown keys {sorted(unknown)}", "rope_scaling")
    return d


def context_limit(scaling: dict | None, max_position_embeddings: int, override: bool) -> int:
    """The length the model is meant to reach: its max_position_embeddings, or with an override that
    extends it, original_max_position_embeddings x factor."""
    if not override or not scaling:
        return max_position_embeddings
    return int(scaling.get("original_max_position_embeddings", max_position_embeddings) * scaling["factor"])


def inv_freq(head_dim: int, theta: float, scaling: dict | None, max_len: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] float64, attention factor) for a model whose positions reach
    max_len."""
    import torch  # here: the config imports this module's checks, and the config is torch-free

    exps = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv = 1.0 / theta ** exps
    kind = kind_of(scaling or {})
    if kind == "default":
        return inv, 1.0
    factor = float(scaling["factor"])
    old = scaling.get("original_max_position_embeddings")
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "dynamic":
        seq = max(max_len, old)
        base = theta * (factor * seq / old - (factor - 1)) ** (head_dim / (head_dim - 2))
        return 1.0 / base ** exps, 1.0
    if kind == "yarn":
        return _yarn(inv, head_dim, theta, factor, old, scaling)
    if kind == "llama3":
        lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        smooth = ((old / wavelen) - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled), 1.0
    if kind == "longrope":
        ext = torch.tensor(scaling["long_factor" if max_len > old else "short_factor"], dtype=torch.float64)
        att = scaling.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old))
        return inv / ext, float(att)
    raise UnsupportedArchitectureError(f"rope scaling type {kind!r} is not supported ({', '.join(KINDS)} are)")


def _yarn(inv: torch.Tensor, D: int, theta: float, factor: float, old: int, sc: dict) -> tuple[torch.Tensor, float]:
    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    att = sc.get("attention_factor")
    if att is None:
        m, m_all = sc.get("mscale"), sc.get("mscale_all_dim")
        att = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = sc.get("beta_fast") or 32, sc.get("beta_slow") or 1

    def dim_of(rotations):  # the dimension whose wavelength makes `rotations` turns over `old` positions
        return D * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(fast), dim_of(slow)
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    import torch

    low, high = max(low, 0), min(high, D - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency (short wavelengths), 0: interpolated
    return inv / factor * (1 - keep) + inv * keep, float(att)
