"""Calibration statistics of every linear layer's input, captured on the engine's module path.

The model is loaded unquantized in float32 and each calibration window runs through
`LLMEngine.prompt_logits` with every layer on the module path (the C decoder stack would run a
layer in one call, out of the hooks' reach); a hook on each Linear adds its input x [T, K] to
    gram      X^T X  [K, K] float64   (GPTQ's Hessian up to a factor; AWQ's error metric)
    abs_sum   sum |x| per channel [K]  (AWQ's activation magnitude)
    sink      X^T X of each window's first SINK_TOKENS rows only [K, K] float64
add() gets one window's rows in position order (row 0 is the window's first token).

The attention projections' Hessian weighs those leading tokens SINK_WEIGHT times (hessian()):
the first tokens of a context are its attention sink, whose key and value every later query reads,
so an error there reaches every position while the plain X^T X counts it once. On the default model
GPTQ's q/k/v fitted to the plain X^T X cut their layer objective to a quarter of round-to-nearest's
yet raised perplexity above round-to-nearest's (the compensation moved error onto the sink tokens);
fitted without the sink rows at all it was worse still. Weighted, GPTQ beats round-to-nearest.
One pass over the float model: every layer's statistics come from float inputs (no layer sees the
quantization error of the layers before it).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ridgeline.errors import InvalidRequestError
from ridgeline.data import corpus
from ridgeline.layers.linear import Linear
from ridgeline.quant.choices import DEFAULT_TOKENS

WINDOW = 512
SINK_TOKENS = 4  # leading rows of each window counted as the attention sink
SINK_WEIGHT = 128  # their weight in an attention projection's Hessian (measured 128 and 512: the same)


@dataclass
class InputStats:
    gram: torch.Tensor  # [K, K] float64
    abs_sum: torch.Tensor  # [K] float64
    rows: int = 0
    sink: torch.Tensor | None = None  # [K, K] float64; None: not measured (hessian() is then the gram)

    @classmethod
    def empty(cls, K: int) -> "InputStats":
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        return cls(z(K, K), z(K), 0, z(K, K))

    @property
    def mean_abs(self) -> torch.Tensor:
        return self.abs_sum / max(self.rows, 1)

    def add(self, x: torch.Tensor) -> None:
        """x: one window's inputs [T, K], rows in position order."""
        x = x.detach().reshape(-1, x.shape[-1]).float()
        self.gram += (x.t() @ x).double()  # one window's sum in fp32, the running total in fp64
        self.abs_sum += x.abs().sum(0).double()
        self.rows += x.shape[0]
        if self.sink is not None:
            s = x[:SINK_TOKENS]
            self.sink += (s.t() @ s).double()

    def hessian(self, attention: bool) -> torch.Tensor:
        """The gram, with the sink rows weighted SINK_WEIGHT times for an attention projection's input."""
        if not attention or self.sink is None:
            return self.gram
        return self.gram + (SINK_WEIGHT - 1) * self.sink

    def scaled(self, s: torch.Tensor) -> "InputStats":
        """The statistics of x / s (s [K] per input channel)."""
        sd = s.double()
        outer = sd[:, None] * sd[None, :]
        return InputStats(self.gram / outer, self.abs_sum / sd, self.rows,
                          None if self.sink is None else self.sink / outer)


def calibration_text(source: str | Path | None) -> tuple[str, str]:
    """(text, name for the config) of --calibration: None -> the shipped calibration part."""
    if source is None:
        return corpus.text("calibration"), "ridgeline/data/texts/calibration.txt (World Factbook, public domain)"
    path = Path(source)
    if path.resolve() == (corpus.TEXTS / "heldout.txt").resolve():
        raise InvalidRequestError("the held-out text is what `ridgeline eval` scores; calibrating on it would "
                                  "leak it: give another file or leave --calibration out", "calibration")
    try:
        return path.read_text(encoding="utf-8"), path.name
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"cannot read calibration text {path}: {e}", "calibration") from None


def capture(folder: Path, text: str, max_tokens: int = DEFAULT_TOKENS, window: int = WINDOW,
            progress: bool = True) -> dict[str, InputStats]:
    """Linear prefix (the engine's names: qkv_proj, o_proj, gate_up_proj, down_proj) -> its input stats."""
    engine = calibration_engine(folder, progress)
    ids = engine.tokenizer.encode(text)
    window = min(window, engine.max_model_len)
    windows = corpus.windows(ids, window, max_tokens) or ([ids[:window]] if len(ids) >= 2 else [])
    if not windows:
        raise InvalidRequestError("the calibration text is empty (it needs at least 2 tokens)", "calibration")
    model = engine.runner.model
    stats: dict[str, InputStats] = {}
    handles = []
    for m in model.modules():
        if isinstance(m, Linear) and m.prefix != "lm_head":
            st = stats[m.prefix] = InputStats.empty(m.in_features)
            handles.append(m.register_forward_pre_hook(lambda _m, args, st=st: st.add(args[0])))
    try:
        with module_path(model), torch.inference_mode():
            for w in tqdm(windows, desc="calibration", unit="window", disable=not progress):
                engine.prompt_logits(w)
    finally:
        for h in handles:
            h.remove()
    return stats


def calibration_engine(folder: Path, progress: bool):
    """The unquantized fp32 engine calibration runs (module path, no prefix cache: every window computed)."""
    from ridgeline.engine.run import start_engine
    return start_engine(str(folder), dtype="float32", quantization="none", kv_cache_memory="256MiB",
                        enable_prefix_caching=False, progress=progress)


@contextmanager
def module_path(model):
    """Every layer on the module path (the Linears' forward runs, hooks included) for the duration."""
    inner = model.model
    saved = inner.segments
    inner.segments = [(0, len(inner.layers), False)]
    try:
        yield
    finally:
        inner.segments = saved
