"""The patcher: the ModelPatcher that loads a network through Ferry, its load steps (LoRA baked,
the layout), its hold through ComfyUI's clones, and recovery from faults."""
