"""Quality of lossy techniques (weight quantization first): perplexity on held-out text, agreement
with the unquantized model and KL divergence of next-token distributions (`ridgeline eval`)."""
