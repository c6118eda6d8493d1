"""Measurement primitives the benchmarks and the advisor's validations share: one decoder layer's
prefill time split into matmuls and attention (`attn_profile`), a KV transfer between two processes'
pools (`kv_transfer`), and what a run records of the machine it ran on (`record`). Imports neither
bench/ nor advisor/: both stand on it."""
