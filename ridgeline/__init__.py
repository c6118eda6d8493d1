"""Ridgeline: an LLM inference engine that knows which wall it is hitting."""
from ridgeline.engine.outputs import CompletionOutput, RequestOutput
from ridgeline.sampling_params import SamplingParams

__all__ = ["LLM", "LoRARequest", "SamplingParams", "RequestOutput", "CompletionOutput"]
from ridgeline.version import __version__  # noqa: E402,F401


def __getattr__(name):  # keep `import ridgeline` light: torch loads only when LLM is used
    if name == "LLM":
        from ridgeline.entrypoints.llm import LLM
        return LLM
    if name == "LoRARequest":
        from ridgeline.lora import LoRARequest
        return LoRARequest
    raise AttributeError(name)
