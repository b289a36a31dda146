"""Test-only ComfyUI nodes for test_comfyui_controlnet.py: loaders of the tiny networks
make_control_models.py writes where core's own loader fixes sizes a tiny file cannot have
(core's detection reads SDXL at 320 channels, Qwen-Image at 3072, clip_vision_h at 1280, and
ModelPatchLoader builds Qwen's block-wise ControlNet at 60 x 3072). Each builds the network
with core's own classes, from the config in the file's metadata, and wraps it in core's
patcher exactly as core's loader does; plus a deterministic image, a VAE stand-in for the
control image's encoding, and a saver of CLIP vision outputs."""

import json
import os
import tempfile

import comfy.clip_vision
import comfy.model_management
import comfy.model_patcher
import comfy.ops
import comfy.supported_models
import comfy.utils
import folder_paths
import torch
from safetensors import safe_open
from safetensors.torch import save_file


def _meta(path):
    with safe_open(path, "pt") as f:
        return {k: json.loads(v) for k, v in (f.metadata() or {}).items()}


class FerryTestTinyModel:
    """A diffusion model of core's model config ``config`` (SDXL, QwenImage) at the sizes in
    the file: what comfy.sd.load_diffusion_model_state_dict does after its detection."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"unet_name": (folder_paths.get_filename_list("diffusion_models"),)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, unet_name):
        path = folder_paths.get_full_path_or_raise("diffusion_models", unet_name)
        meta = _meta(path)
        config = getattr(comfy.supported_models, meta["config"])(meta["unet"])
        config.set_inference_dtype(torch.float32, None)
        model = config.get_model({}, "", device=comfy.model_management.unet_offload_device())
        model.load_model_weights(comfy.utils.load_torch_file(path), "")
        load = comfy.model_management.get_torch_device()
        off = comfy.model_management.unet_offload_device()
        return (comfy.model_patcher.ModelPatcher(model, load_device=load, offload_device=off),)


class FerryTestTinyModelPatch:
    """Qwen-Image's block-wise ControlNet at the file's sizes, as ModelPatchLoader builds it
    at 60 x 3072 (core's class, manual_cast layers, core's patcher)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": (folder_paths.get_filename_list("model_patches"),)}}

    RETURN_TYPES = ("MODEL_PATCH",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, name):
        from comfy_extras.nodes_model_patch import QwenImageBlockWiseControlNet

        path = folder_paths.get_full_path_or_raise("model_patches", name)
        sd = comfy.utils.load_torch_file(path)
        model = QwenImageBlockWiseControlNet(
            device=comfy.model_management.unet_offload_device(),
            dtype=comfy.utils.weight_dtype(sd),
            operations=comfy.ops.manual_cast,
            **_meta(path)["patch"],
        )
        model.load_state_dict(sd)
        load = comfy.model_management.get_torch_device()
        off = comfy.model_management.unet_offload_device()
        return (comfy.model_patcher.ModelPatcher(model, load_device=load, offload_device=off),)


class FerryTestTinyClipVision:
    """Core's ClipVisionModel from the file's config (clip_vision_h's keys, tiny sizes), its
    weights loaded as comfy.clip_vision.load_clipvision_from_sd does."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"clip_name": (folder_paths.get_filename_list("clip_vision"),)}}

    RETURN_TYPES = ("CLIP_VISION",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, clip_name):
        path = folder_paths.get_full_path_or_raise("clip_vision", clip_name)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(_meta(path)["config"], f)
        try:
            clip = comfy.clip_vision.ClipVisionModel(f.name)
        finally:
            os.unlink(f.name)
        missing, unexpected = clip.load_sd(comfy.utils.load_torch_file(path))
        assert not missing and not unexpected, (missing, unexpected)
        return (clip,)


class FerryTestImage:
    """A seeded random IMAGE ([1, height, width, 3] in 0..1)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0}), "width": ("INT", {"default": 64}),
                             "height": ("INT", {"default": 64})}}  # fmt: skip

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, seed, width, height):
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(1, height, width, 3, generator=g),)


class _LatentVAE:
    """What the model patch's node asks of a VAE (comfy/sd.py VAE): ``encode`` an image
    [B, H, W, C] to Wan 2.1's latent [B, 16, 1, H/8, W/8], and its spatial compression; the
    latent is a fixed function of the image (its 8 x 8 means, repeated over the channels)."""

    def spacial_compression_encode(self):
        return 8

    def encode(self, image):
        x = torch.nn.functional.avg_pool2d(image.movedim(-1, 1).float(), 8).mean(1, keepdim=True)
        return x.repeat(1, 16, 1, 1).unsqueeze(2) * torch.linspace(0.5, 1.5, 16).view(
            1, 16, 1, 1, 1
        )


class FerryTestLatentVAE:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ("VAE",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self):
        return (_LatentVAE(),)


class FerryTestSaveClipVisionOutput:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"clip_vision_output": ("CLIP_VISION_OUTPUT",),
                             "filename_prefix": ("STRING", {"default": "cv"})}}  # fmt: skip

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def save(self, clip_vision_output, filename_prefix):
        names = ("last_hidden_state", "image_embeds", "penultimate_hidden_states")
        out = {
            n: getattr(clip_vision_output, n).contiguous()
            for n in names
            if hasattr(clip_vision_output, n)
        }
        path = os.path.join(folder_paths.get_output_directory(), f"{filename_prefix}.safetensors")
        save_file(out, path)
        return {}


class FerryTestNoPatcherControlNet:
    """A CONTROL_NET with no patcher of its own, as core's T2I adapters are (ControlBase)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ("CONTROL_NET",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self):
        import comfy.controlnet

        return (comfy.controlnet.ControlBase(),)


NODE_CLASS_MAPPINGS = {
    "FerryTestNoPatcherControlNet": FerryTestNoPatcherControlNet,
    "FerryTestTinyModel": FerryTestTinyModel,
    "FerryTestTinyModelPatch": FerryTestTinyModelPatch,
    "FerryTestTinyClipVision": FerryTestTinyClipVision,
    "FerryTestImage": FerryTestImage,
    "FerryTestLatentVAE": FerryTestLatentVAE,
    "FerryTestSaveClipVisionOutput": FerryTestSaveClipVisionOutput,
}
