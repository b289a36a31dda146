"""A test-only ComfyUI node pack (copied into the test's custom_nodes folder, never shipped).

ComfyUI core has no node that makes CONDITIONING without a text encoder; this one makes a
seeded random one shaped for the tiny SD3 model (context 8 tokens x 32, pooled 32).
"""

import torch


class FerryTestConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1})}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, seed):
        g = torch.Generator().manual_seed(seed)
        context = torch.randn(1, 8, 32, generator=g)
        pooled = torch.randn(1, 32, generator=g)
        return ([[context, {"pooled_output": pooled}]],)


NODE_CLASS_MAPPINGS = {"FerryTestConditioning": FerryTestConditioning}
