"""LoRA on an engine: the option checks before it is built and the manager attached to its runner after, the
one way `LLM(..., enable_lora=True)` and the benchmarks do it."""
from __future__ import annotations

from ridgeline.errors import InvalidRequestError
from ridgeline.lora.manager import LoRAManager


def check_options(config) -> None:
    """Before the engine is built: the combinations LoRA does not run with."""
    method = config.speculative.speculative_method
    if config.lora.enable_lora and method not in (None, "ngram"):
        raise InvalidRequestError(f"speculative_method {method!r} with LoRA adapters: a draft made for the base "
                                  "model is not used for adapters (use 'ngram' or 'none')", "speculative_method")


def attach(engine) -> LoRAManager | None:
    """The engine's adapter manager, set as its runner's deltas; None when the config does not enable LoRA."""
    lora = engine.config.lora
    if not lora.enable_lora:
        return None
    runner = engine.runner
    runner.deltas = manager = LoRAManager(runner.model, lora.max_lora_rank, runner.device)
    return manager
