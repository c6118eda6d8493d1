"""Measurement primitives the benchmarks and the advisor's validations share: one decoder layer's
prefill time split into matmuls and attention (`attn_profile`) and a KV transfer between two
processes' pools (`kv_transfer`). Imports neither bench/ nor advisor/: both stand on it."""
