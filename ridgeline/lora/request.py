"""What a caller names: an adapter by name and where its files are, in vLLM's spelling
(`LoRARequest(lora_name, lora_int_id, lora_path)`)."""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int = 0  # vLLM's integer id; accepted for its callers' sake, the name identifies an adapter
    lora_path: str = ""

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name.strip():
            raise InvalidRequestError("lora_request: lora_name must be a non-empty string", "lora_request")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidRequestError(f"lora_request {self.lora_name!r}: lora_path must name the adapter's folder",
                                      "lora_request")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int):
            raise InvalidRequestError("lora_request: lora_int_id must be an integer", "lora_request")

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
