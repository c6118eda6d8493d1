"""Quantization by calibration: `ridgeline quantize` (GPTQ, AWQ, clipping) over a calibration text, the
model run layer by layer through the runner. The formats it writes live in the core (formats/, layers/)."""
