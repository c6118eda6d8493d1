"""What `ridgeline quantize` offers, in a module that loads no torch (its flags are built for `--help`)."""

METHODS = ("rtn", "gptq", "awq")
BITS = (4,)
DEFAULT_TOKENS = 16384  # calibration tokens
