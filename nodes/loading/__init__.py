"""Loading: Ferry's loaders' networks built on meta, their weights left in their files (safetensors,
GGUF, core's fp8_scaled and comfy_quant) until a Ferry offload node lays them out."""
