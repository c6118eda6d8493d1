"""The weight and KV formats: quantized tensors and their math (round to nearest, the int4 grid, fp8 /
MX / NV blocks, the hub's packed layouts), the KV cache formats, and the table of quantization names."""
