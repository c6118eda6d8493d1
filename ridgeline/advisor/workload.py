"""The traffic: lengths, concurrency (or a request rate), prefix sharing, SLOs, number formats."""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.advisor.errors import AdvisorError, require_positive
from ridgeline.advisor.units import precision


@dataclass(frozen=True)
class Workload:
    prompt_len: int = 1024
    output_len: int = 256
    concurrency: int = 16  # requests decoding at once (ignored when rate is set)
    rate: float | None = None  # requests/s; concurrency then follows from Little's law
    prefix_share: float = 0.0  # f: fraction of each prompt that is a prefix shared across requests
    ttft_slo: float = 1.0  # s
    tpot_slo: float = 0.05  # s per output token
    weight_precision: str = "bf16"
    kv_precision: str = "bf16"

    def __post_init__(self):
        for name in ("prompt_len", "output_len", "concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise AdvisorError(f"{name.replace('_', ' ')} must be a positive integer, got {value!r}", name)
        require_positive("ttft_slo", self.ttft_slo)
        require_positive("tpot_slo", self.tpot_slo)
        if self.rate is not None:
            require_positive("rate", self.rate)
        if not 0 <= self.prefix_share < 1:
            raise AdvisorError(f"prefix share f must be in [0, 1), got {self.prefix_share}", "prefix_share")
        object.__setattr__(self, "weight_precision", precision(self.weight_precision))
        object.__setattr__(self, "kv_precision", precision(self.kv_precision))

    @property
    def context(self) -> int:
        """Tokens a request holds in the KV cache at its end."""
        return self.prompt_len + self.output_len

    @property
    def mean_decode_context(self) -> float:
        """Average tokens attended to per decode step."""
        return self.prompt_len + self.output_len / 2

    def check_fits(self, max_context: int, model: str) -> None:
        if self.context > max_context:
            raise AdvisorError(f"prompt + output = {self.prompt_len} + {self.output_len} = {self.context} tokens, "
                               f"over {model}'s maximum context of {max_context} tokens", "prompt_len")

    def summary(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}
