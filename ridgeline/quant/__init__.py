"""Weight quantization: round-to-nearest quantizers (rtn.py), the quantized weight formats of the
weight-format registry (formats.py) and the `quantization` engine option (options.py)."""
