"""Runs the quality measures (metrics.py) for engine settings against the unquantized reference.

The reference is the same model with the same engine options, less every lossy one (quantization,
and a quantized KV cache where the engine has that option). Per setting:
  perplexity   the held-out windows scored through prompt logprobs, as a user would score a text
               (`SamplingParams(prompt_logprobs=0, max_tokens=0)`; the scheduler batches them)
  agreement/KL each window's whole next-token distributions from both models
               (LLMEngine.prompt_logits); the reference's are recomputed per setting, so only two
               engines are ever loaded at once
  divergence   greedy generations from the opening tokens of held-out profiles, both models
KV eviction settings: prompt_logits runs one whole-prompt forward that never evicts, so their top-1
agreement comes from the perplexity pass itself (each position's top-1 prompt logprob against the
reference's, teacher-forced through the same chunked steps that evict) and KL is not measured.
"""
from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from ridgeline.data import corpus
from ridgeline.engine.run import run_to_completion
from ridgeline.eval.metrics import Totals, tokens_before_divergence

# option -> its value in the reference engine, for the lossy options this engine build knows
LOSSLESS = {"quantization": "none", "quant_group_size": None, "quant_symmetric": False, "layer_formats": (),
            "kv_cache_dtype": "auto", "kv_cache_dtype_k": None, "kv_cache_dtype_v": None, "kv_eviction": "none"}
PROMPT_TOKENS = 32  # opening tokens of a held-out profile that a divergence prompt gives
CHUNK = 8  # windows handed to the scheduler at once in the perplexity pass


@dataclass(frozen=True)
class Setting:
    name: str
    options: dict = field(default_factory=dict)  # engine options over the base ones
    component: str | None = None  # what a sweep entry quantizes


@dataclass
class Result:
    name: str
    options: dict
    weight_formats: str
    weight_bytes: int
    perplexity: float
    agreement: float | None  # None for the reference itself
    kl: float | None
    divergence: list[int]  # per prompt: tokens generated before the first difference from the reference
    gen_tokens: int
    seconds: float
    component: str | None = None
    kv_tokens: int | None = None  # KV eviction: tokens of KV a request holds at most (None: all of them)
    agreement_by_position: dict[str, float] | None = None  # Totals.agreement_by_position; None for the reference

    @property
    def mean_divergence(self) -> float:
        return statistics.fmean(self.divergence) if self.divergence else float("nan")

    @property
    def identical(self) -> float:
        """Fraction of prompts generated exactly as the reference did."""
        return sum(d == self.gen_tokens for d in self.divergence) / len(self.divergence) if self.divergence else 1.0

    def to_dict(self) -> dict:
        return {"name": self.name, "component": self.component, "options": self.options,
                "weight_formats": self.weight_formats, "weight_bytes": self.weight_bytes,
                "perplexity": self.perplexity, "top1_agreement": self.agreement, "mean_kl": self.kl,
                "tokens_before_divergence": self.divergence, "mean_tokens_before_divergence": self.mean_divergence,
                "identical_generations": self.identical, "gen_tokens": self.gen_tokens, "seconds": self.seconds,
                "kv_tokens_per_request": self.kv_tokens, "top1_agreement_by_position": self.agreement_by_position}


def reference_options(options: dict) -> dict:
    """The base engine options with every lossy one at its lossless value."""
    return {**options, **{k: v for k, v in LOSSLESS.items() if k in options or k == "quantization"}}


class Evaluator:
    """make_engine(options) -> an LLMEngine; window/max_tokens: how the held-out text is cut; prompts and
    gen_tokens: the divergence test (0 prompts skips it)."""

    def __init__(self, make_engine: Callable[[dict], object], options: dict, window: int = 512,
                 max_tokens: int | None = 16384, prompts: int = 16, gen_tokens: int = 64, progress: bool = True,
                 log: Callable[[str], None] = lambda line: None):
        self.make_engine, self.options, self.progress, self.log = make_engine, options, progress, log
        self.window, self.max_tokens, self.num_prompts, self.gen_tokens = window, max_tokens, prompts, gen_tokens
        self.ref = None
        self.windows: list[list[int]] = []
        self.prompts: list[list[int]] = []
        self.ref_gen: list[list[int]] = []
        self.ref_top1: list[list[int]] = []  # per window, the reference's top-1 after each position

    def start(self) -> Result:
        """Load the reference, cut the text, and measure the reference itself."""
        t0 = time.perf_counter()
        self.ref = self.make_engine(reference_options(self.options))
        tok = self.ref.tokenizer
        self.windows = corpus.windows(tok.encode(corpus.text("heldout")), self.window, self.max_tokens)
        docs = corpus.documents("heldout")[:self.num_prompts]
        self.prompts = [tok.encode(d)[:PROMPT_TOKENS] for d in docs]
        self.ref_gen = self._generate(self.ref)
        nll, self.ref_top1 = self._perplexity(self.ref, "reference")
        info = self.ref.info
        return Result("none (reference)", {}, info.weight_formats, info.weight_bytes, nll.perplexity, None, None,
                      [self.gen_tokens] * len(self.prompts), self.gen_tokens, time.perf_counter() - t0)

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.windows))

    def measure(self, setting: Setting) -> Result:
        t0 = time.perf_counter()
        engine = self.make_engine({**self.options, **setting.options})
        try:
            info = engine.info
            self.log(f"{setting.name}: weights {info.weight_formats}: {info.weight_bytes / 1e6:.1f} MB")
            totals, top1 = self._perplexity(engine, setting.name)
            evicting = info.kv_eviction is not None
            if evicting:
                for ref, got in zip(self.ref_top1, top1):
                    totals.add_agreement(ref, got)
            else:
                self._compare(engine, totals, setting.name)
            gen = self._generate(engine)
            div = [tokens_before_divergence(r, g) for r, g in zip(self.ref_gen, gen)]
            return Result(setting.name, setting.options, info.weight_formats, info.weight_bytes, totals.perplexity,
                          totals.agreement, None if evicting else totals.mean_kl, div, self.gen_tokens,
                          time.perf_counter() - t0, setting.component,
                          info.tokens_per_request if evicting else None, totals.agreement_by_position)
        finally:
            del engine
            gc.collect()

    def _bar(self, total: int, desc: str):
        return tqdm(total=total, desc=desc, unit="tok", unit_scale=True, disable=not self.progress, leave=False)

    def _perplexity(self, engine, name: str) -> tuple[Totals, list[list[int]]]:
        """Perplexity over the windows, and each window's top-1 token after each position."""
        from ridgeline.sampling_params import SamplingParams
        totals, top1 = Totals(), []
        params = SamplingParams(prompt_logprobs=1, max_tokens=0)
        with self._bar(self.num_tokens, f"{name}: perplexity") as bar:
            for i in range(0, len(self.windows), CHUNK):
                chunk = self.windows[i:i + CHUNK]
                for out in run_to_completion(engine, chunk, params):
                    totals.add_logprobs([lp.logprob for lp in out.prompt_logprobs[1:]])
                    top1.append([lp.top[0][0] for lp in out.prompt_logprobs[1:]])
                bar.update(sum(map(len, chunk)))
        return totals, top1

    def _compare(self, engine, totals: Totals, name: str) -> None:
        """Rows 0..W-2 of each window: the positions that predict a token of the window."""
        with self._bar(self.num_tokens, f"{name}: agreement, KL") as bar:
            for w in self.windows:
                totals.add_comparison(self.ref.prompt_logits(w)[:-1], engine.prompt_logits(w)[:-1])
                bar.update(len(w))

    def _generate(self, engine) -> list[list[int]]:
        if not self.prompts:
            return []
        from ridgeline.sampling_params import SamplingParams
        params = SamplingParams(temperature=0, max_tokens=self.gen_tokens, ignore_eos=True)
        return [list(o.outputs[0].token_ids) for o in run_to_completion(engine, self.prompts, params)]
