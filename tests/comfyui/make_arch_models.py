"""Tiny random diffusion models of the architectures ComfyUI core runs, one file per
architecture, for the architecture sweep (test_comfyui_arch_sweep.py).

Each is built by core's own model config (``comfy.model_detection.model_config_from_unet_config``
of a small ``unet_config``, then ``get_model``), so its keys are exactly core's; its parameters
are seeded random numbers (per key, so a file is the same whatever else is built), saved
under ``models/diffusion_models/ferry-arch-<name>.safetensors`` in float32 (what core computes
in on a CPU, so Ferry's disk tier reads the groups straight from the file), or in bf16 where
that would be over ``FP32_BYTES`` (then they are cast as they are read). A model is kept only
when core's detection, reading the saved file, picks the same model config and builds a
network of exactly the saved keys and shapes. Where detection fixes a size (a width, a block
count or a text width written into core), the file is built at that size; where that makes
it bigger than ``MAX_BYTES`` (or cannot be built), this core skips it, saying why. Specs are
written for the newest core (v0.33.0); a key an older core's network does not take is
dropped. ``SKIP`` lists core's model configs the sweep does not build, with why.

Run with ComfyUI's Python; writes ``<models dir>/arch-sweep.json``: per architecture its
file, latent shape and conditioning, or why it was not built in this core:

    python make_arch_models.py <comfyui checkout> <models dir> [name ...]
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from typing import Any

#: Above this a file is not built unless its spec says "big" (run only by name).
MAX_BYTES = 512 * 2**20
#: Up to this a file is saved in float32, above it in bf16.
FP32_BYTES = 128 * 2**20
# A fixed T5/Qwen-style text width several of core's configs write in.
_C1024 = 1024

#: name -> (core's model config class, unet_config as core's detection reads it from the
#: file, conditioning {tokens, dim, pooled}, latent shape without the batch). The sizes
#: detection derives from tensor shapes are small; the ones it fixes are core's.
ARCHS: dict[str, dict[str, Any]] = {
    "hunyuan_video_1.5": {
        "config": "HunyuanVideo15",
        "unet": {
            "image_model": "hunyuan_video", "in_channels": 65, "patch_size": [1, 1, 1],
            "out_channels": 32, "vec_in_dim": None, "axes_dim": [16, 56, 56], "meanflow": False,
            "context_in_dim": 32, "hidden_size": 128, "mlp_ratio": 4.0, "num_heads": 1,
            "depth": 2, "depth_single_blocks": 2, "theta": 256, "qkv_bias": True, "byt5": False,
            "guidance_embed": False, "use_cond_type_embedding": True, "vision_in_dim": 1152,
            "meanflow_sum": True,
        },
        # core's HunyuanVideo asks for a pooled output (its vector_in's, unused without one)
        "cond": {"tokens": 8, "dim": 32, "pooled": 768},
        "latent": [32, 1, 8, 8],
    },
    "cosmos_predict2": {
        "config": "CosmosT2IPredict2",
        "unet": {
            "image_model": "cosmos_predict2", "max_img_h": 240, "max_img_w": 240,
            "max_frames": 128, "in_channels": 16, "out_channels": 16, "patch_spatial": 2,
            "patch_temporal": 1, "model_channels": 192, "concat_padding_mask": True,
            "crossattn_emb_channels": _C1024, "pos_emb_cls": "rope3d",
            "pos_emb_learnable": True, "pos_emb_interpolation": "crop", "min_fps": 1,
            "max_fps": 30, "use_adaln_lora": True, "adaln_lora_dim": 256, "num_blocks": 2,
            "extra_per_block_abs_pos_emb": False, "rope_h_extrapolation_ratio": 4.0,
            "rope_w_extrapolation_ratio": 4.0, "rope_t_extrapolation_ratio": 1.0,
            "extra_h_extrapolation_ratio": 1.0, "extra_w_extrapolation_ratio": 1.0,
            "extra_t_extrapolation_ratio": 1.0, "rope_enable_fps_modulation": False,
        },
        "cond": {"tokens": 8, "dim": _C1024, "pooled": 0},
        "latent": [16, 1, 8, 8],
    },
}  # fmt: skip
ARCHS["hunyuan_video_1.5_sr"] = {
    **ARCHS["hunyuan_video_1.5"],
    "config": "HunyuanVideo15_SR_Distilled",
    "unet": {**ARCHS["hunyuan_video_1.5"]["unet"], "in_channels": 98},
}
ARCHS["anima"] = {
    **ARCHS["cosmos_predict2"],
    "config": "Anima",
    "unet": {**ARCHS["cosmos_predict2"]["unet"], "image_model": "anima"},
}
ARCHS["cosmos_1"] = {
    "config": "CosmosT2V",
    # Not 4096 wide: core's detection then takes the 14B layout (36 blocks, 40 heads, learnable
    # per-block position embeddings); 480 wide gives 12-wide heads, the least its rope splits
    # (a third of a head each for height and width, at least 4 wide).
    "unet": {
        "image_model": "cosmos", "max_img_h": 240, "max_img_w": 240, "max_frames": 128,
        "in_channels": 16, "out_channels": 16, "patch_spatial": 2, "patch_temporal": 1,
        "model_channels": 480, "block_config": "FA-CA-MLP", "concat_padding_mask": True,
        "pos_emb_cls": "rope3d", "pos_emb_learnable": False, "pos_emb_interpolation": "crop",
        "block_x_format": "THWBD", "affline_emb_norm": True, "use_adaln_lora": True,
        "adaln_lora_dim": 256, "num_blocks": 36, "num_heads": 40,
        "extra_per_block_abs_pos_emb": True, "rope_h_extrapolation_ratio": 2.0,
        "rope_w_extrapolation_ratio": 2.0, "rope_t_extrapolation_ratio": 2.0,
        "extra_h_extrapolation_ratio": 2.0, "extra_w_extrapolation_ratio": 2.0,
        "extra_t_extrapolation_ratio": 2.0, "extra_per_block_abs_pos_emb_type": "learnable",
    },
    "cond": {"tokens": 8, "dim": _C1024, "pooled": 0},
    "latent": [16, 1, 8, 8],
}  # fmt: skip

_MMDIT = {  # SD3: core reads the width as 64 x depth
    "in_channels": 16,
    "patch_size": 2,
    "out_channels": 16,
    "depth": 2,
    "input_size": None,
    "adm_in_channels": 32,
    "pos_embed_max_size": 16,
    "num_patches": 256,
    "pos_embed_scaling_factor": None,
    "x_block_self_attn_layers": [],
    "context_embedder_config": {
        "target": "torch.nn.Linear",
        "params": {"in_features": 32, "out_features": 128},
    },
}
_FLUX = {  # 128 wide: one head of the axes core fixes (16 + 56 + 56)
    "image_model": "flux",
    "in_channels": 16,
    "out_channels": 16,
    "patch_size": 2,
    "hidden_size": 128,
    "num_heads": 1,
    "axes_dim": [16, 56, 56],
    "theta": 10000,
    "mlp_ratio": 4.0,
    "qkv_bias": True,
    "context_in_dim": 32,
    "vec_in_dim": 32,
    "depth": 2,
    "depth_single_blocks": 2,
    "guidance_embed": True,
    "txt_ids_dims": [],
    "yak_mlp": False,
    "txt_norm": False,
}
_WAN = {  # 128 wide: one head (core divides by 128); the text width 4096 is core's
    "image_model": "wan2.1",
    "model_type": "t2v",
    "dim": 128,
    "out_dim": 16,
    "num_heads": 1,
    "ffn_dim": 256,
    "num_layers": 2,
    "patch_size": (1, 2, 2),
    "freq_dim": 256,
    "window_size": (-1, -1),
    "qk_norm": True,
    "cross_attn_norm": True,
    "eps": 1e-6,
    "in_dim": 16,
}
_HUNYUAN_VIDEO = {
    "image_model": "hunyuan_video",
    "in_channels": 16,
    "patch_size": [1, 2, 2],
    "out_channels": 16,
    "vec_in_dim": 768,
    "axes_dim": [16, 56, 56],
    "context_in_dim": 32,
    "hidden_size": 128,
    "mlp_ratio": 4.0,
    "num_heads": 1,
    "depth": 1,
    "depth_single_blocks": 1,
    "theta": 256,
    "qkv_bias": True,
    "guidance_embed": True,
    "byt5": False,
    "meanflow": False,
    "use_cond_type_embedding": False,
    "vision_in_dim": None,
    "meanflow_sum": False,
}
ARCHS.update({
    "sd3": {
        "config": "SD3", "unet": _MMDIT,
        "cond": {"tokens": 8, "dim": 32, "pooled": 32}, "latent": [16, 16, 16],
    },
    "flux": {
        "config": "Flux", "unet": _FLUX,
        "cond": {"tokens": 8, "dim": 32, "pooled": 32}, "latent": [16, 16, 16],
    },
    "flux_schnell": {
        "config": "FluxSchnell", "unet": {**_FLUX, "guidance_embed": False},
        "cond": {"tokens": 8, "dim": 32, "pooled": 32}, "latent": [16, 16, 16],
    },
    "flux2": {
        "config": "Flux2",
        "unet": {  # 128 wide: one head of core's axes (4 x 32)
            "image_model": "flux2", "axes_dim": [32, 32, 32, 32], "num_heads": 1,
            "mlp_ratio": 3.0, "theta": 2000, "out_channels": 128, "global_modulation": True,
            "mlp_silu_act": True, "qkv_bias": False, "ops_bias": False,
            "default_ref_method": "index", "ref_index_scale": 10.0, "txt_ids_dims": [3],
            "patch_size": 1, "in_channels": 128, "hidden_size": 128, "context_in_dim": 32,
            "vec_in_dim": None, "depth": 2, "depth_single_blocks": 2, "guidance_embed": True,
        },
        "cond": {"tokens": 8, "dim": 32, "pooled": 0}, "latent": [128, 8, 8],
    },
    "hunyuan_video": {
        "config": "HunyuanVideo", "unet": _HUNYUAN_VIDEO,
        "cond": {"tokens": 8, "dim": 32, "pooled": 768}, "latent": [16, 1, 8, 8],
    },
    "wan2.1_t2v": {
        "config": "WAN21_T2V", "unet": _WAN,
        "cond": {"tokens": 8, "dim": 4096, "pooled": 0}, "latent": [16, 1, 8, 8],
    },
    "wan2.1_i2v": {
        "config": "WAN21_I2V", "unet": {**_WAN, "model_type": "i2v", "in_dim": 36},
        "cond": {"tokens": 8, "dim": 4096, "pooled": 0}, "latent": [16, 1, 8, 8],
    },
    "wan2.2_ti2v": {
        "config": "WAN22_T2V", "unet": {**_WAN, "out_dim": 48, "in_dim": 48},
        "cond": {"tokens": 8, "dim": 4096, "pooled": 0}, "latent": [48, 1, 8, 8],
    },
    "ltxv": {
        "config": "LTXV",
        # core fixes 32 heads: 4-wide heads; the caption width 4096 is core's
        "unet": {
            "image_model": "ltxv", "num_layers": 2, "attention_head_dim": 4,
            "cross_attention_dim": 128, "use_keyframes_abs_pos_embedding": False,
        },
        "cond": {"tokens": 8, "dim": 4096, "pooled": 0, "attention_mask": True},
        "latent": [128, 1, 4, 4],
    },
    "pixart_sigma": {
        "config": "PixArtSigma",
        "unet": {  # core fixes 1152 wide and 16 heads
            "image_model": "pixart_sigma", "num_heads": 16, "patch_size": 2,
            "hidden_size": 1152, "in_channels": 4, "depth": 2, "micro_condition": False,
        },
        # core's sincos table needs a latent of 64 or more (512 px)
        "cond": {"tokens": 8, "dim": 4096, "pooled": 0}, "latent": [4, 64, 64],
    },
    "sd1.5": {
        "config": "SD15",
        "unet": {  # core fixes 320 channels and a 768-wide context; one level, one block
            "use_checkpoint": False, "image_size": 32, "use_spatial_transformer": True,
            "legacy": False, "adm_in_channels": None, "in_channels": 4, "out_channels": 4,
            "model_channels": 320, "num_res_blocks": [1], "transformer_depth": [1],
            "transformer_depth_output": [1, 1], "channel_mult": [1],
            "transformer_depth_middle": 1, "use_linear_in_transformer": False,
            "context_dim": 768, "use_temporal_resblock": False, "use_temporal_attention": False,
        },
        "cond": {"tokens": 8, "dim": 768, "pooled": 0}, "latent": [4, 16, 16],
    },
    "longcat_image": {
        "config": "LongCatImage",  # Flux's layout; core tells it by the text width 3584
        "unet": {
            **_FLUX, "guidance_embed": False, "vec_in_dim": None, "context_in_dim": 3584,
            "txt_ids_dims": [1, 2],
        },
        "cond": {"tokens": 8, "dim": 3584, "pooled": 0}, "latent": [16, 16, 16],
    },
    "hunyuan_image_2.1": {
        "config": "HunyuanImage21",
        "unet": {
            **_HUNYUAN_VIDEO, "in_channels": 64, "out_channels": 64, "patch_size": [1, 1],
            "vec_in_dim": None, "axes_dim": [64, 64], "guidance_embed": False,
        },
        "cond": {"tokens": 8, "dim": 32, "pooled": 768}, "latent": [64, 8, 8],
    },
    "cogvideox": {
        "config": "CogVideoX_T2V",
        "unet": {  # core fixes 64-wide heads: one head
            "image_model": "cogvideox", "num_attention_heads": 1, "attention_head_dim": 64,
            "time_embed_dim": 64, "num_layers": 2, "in_channels": 16, "patch_size": 2,
            "text_embed_dim": 32, "use_learned_positional_embeddings": False,
            "use_rotary_positional_embeddings": True,
        },
        "cond": {"tokens": 8, "dim": 32, "pooled": 0}, "latent": [16, 1, 8, 8],
    },
    "kandinsky5": {
        "config": "Kandinsky5",
        "unet": {  # heads of core's 64 (16 + 24 + 24); text widths 3584 and 768 are core's
            "image_model": "kandinsky5", "model_dim": 128, "time_dim": 64, "ff_dim": 256,
            "visual_embed_dim": 132, "num_text_blocks": 2, "num_visual_blocks": 2,
        },
        "cond": {"tokens": 8, "dim": 3584, "pooled": 768}, "latent": [16, 1, 8, 8],
    },
    "hunyuan_video_i2v": {
        "config": "HunyuanVideoI2V", "unet": {**_HUNYUAN_VIDEO, "in_channels": 33},
        "cond": {"tokens": 8, "dim": 32, "pooled": 768}, "latent": [16, 1, 8, 8],
    },
    "hunyuan_video_skyreels_i2v": {
        "config": "HunyuanVideoSkyreelsI2V", "unet": {**_HUNYUAN_VIDEO, "in_channels": 32},
        "cond": {"tokens": 8, "dim": 32, "pooled": 768}, "latent": [16, 1, 8, 8],
    },
    "cosmos_predict2_i2v": {
        "config": "CosmosI2VPredict2",
        "unet": {  # core sets the rope ratios only for its two real widths
            **{
                k: v
                for k, v in ARCHS["cosmos_predict2"]["unet"].items()
                if not k.startswith(("rope_", "extra_"))
            },
            "in_channels": 17,
        },
        "cond": {"tokens": 8, "dim": _C1024, "pooled": 0}, "latent": [16, 1, 8, 8],
    },
    "flux_inpaint": {
        "config": "FluxInpaint", "unet": {**_FLUX, "in_channels": 96},
        "cond": {"tokens": 8, "dim": 32, "pooled": 32}, "latent": [16, 16, 16],
    },
    "wan2.1_fun_control": {
        "config": "WAN21_FunControl2V", "unet": {**_WAN, "model_type": "i2v", "in_dim": 48},
        "cond": {"tokens": 8, "dim": 4096, "pooled": 0}, "latent": [16, 1, 8, 8],
    },
    "wan2.1_vace": {
        "config": "WAN21_Vace",
        "unet": {**_WAN, "model_type": "vace", "vace_in_dim": 96, "vace_layers": 1},
        "cond": {"tokens": 8, "dim": 4096, "pooled": 0}, "latent": [16, 1, 8, 8],
    },
    "hunyuan_dit": {
        "config": "HunyuanDiT",
        "unet": {"image_model": "hydit", "depth": 2, "hidden_size": 128},
        "cond": {  # its CLIP (77 x 1024) and mT5 (256 x 2048) outputs and masks, as core's
            "tokens": 77, "dim": 1024, "pooled": 0, "attention_mask": True,
            "extra": {"conditioning_mt5xl": [1, 256, 2048], "attention_mask_mt5xl": "ones:1,256"},
        },
        "latent": [4, 16, 16],
    },
    "sdxl": {
        "config": "SDXL", "big": True,  # core fixes 320 channels and its 0/2/10-deep levels
        "unet": {
            "use_checkpoint": False, "image_size": 32, "use_spatial_transformer": True,
            "legacy": False, "num_classes": "sequential", "adm_in_channels": 2816,
            "in_channels": 4, "out_channels": 4, "model_channels": 320,
            "num_res_blocks": [2, 2, 2], "transformer_depth": [0, 0, 2, 2, 10, 10],
            "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10], "channel_mult": [1, 1, 1],
            "transformer_depth_middle": 10, "use_linear_in_transformer": True,
            "context_dim": 2048, "use_temporal_resblock": False, "use_temporal_attention": False,
        },
        "cond": {"tokens": 8, "dim": 2048, "pooled": 1280}, "latent": [4, 16, 16],
    },
    "qwen_image": {
        "config": "QwenImage", "big": True,  # core fixes 3072 wide, 24 heads, text 3584
        "unet": {"image_model": "qwen_image", "in_channels": 64, "num_layers": 2},
        "cond": {"tokens": 8, "dim": 3584, "pooled": 0}, "latent": [16, 1, 16, 16],
    },
    "lumina2": {
        "config": "Lumina2", "big": True,  # core sets heads for 2304 and 3840 wide only
        "unet": {
            "image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 2304,
            "cap_feat_dim": 32, "n_layers": 1, "qk_norm": True, "n_heads": 24,
            "n_kv_heads": 8, "axes_dims": [32, 32, 32], "axes_lens": [300, 512, 512],
            "rope_theta": 10000.0, "ffn_dim_multiplier": 4.0,
        },
        # v0.3.64 counts the text tokens from the attention mask only
        "cond": {"tokens": 8, "dim": 32, "pooled": 0, "attention_mask": True},
        "latent": [16, 16, 16],
    },
})  # fmt: skip

ARCHS["sd2.0"] = {
    "config": "SD20",
    "unet": {  # core fixes 320 channels and a 1024-wide context
        **ARCHS["sd1.5"]["unet"],
        "context_dim": 1024,
        "use_linear_in_transformer": True,
    },
    "cond": {"tokens": 8, "dim": 1024, "pooled": 0},
    "latent": [4, 16, 16],
}

_UNET_EXTRA = (
    "a UNet variant whose conditioning carries concat latents, CLIP-vision embeddings or camera "
    "and noise-augmentation inputs that FerryTestConditioning does not make (not attempted; "
    "SD 1.5/2.0/XL run the same UNet code)"
)
_FIXED = "core's detection fixes every size: "
_DEFAULTS = "core builds it at its class defaults (reads no size from the file): the real size"
_WAN_EXTRA = (
    "a Wan 2.1 network with camera, audio, pose, face or causal inputs of its own "
    "(not attempted; Wan T2V, I2V, Fun Control, VACE and 2.2 TI2V run the same blocks)"
)
_AUDIO = "an audio model: 1-D latents and a conditioner of its own (not attempted)"
_3D = "a 3D-shape model: its latent is a set of shape tokens with image features (not attempted)"
_NEW = "a 2026 architecture not attempted in this sweep"
#: Core's model configs (``comfy.supported_models.models``, v0.33.0) the sweep does not
#: build, and why; every other one is an ``ARCHS`` entry's config.
SKIP: dict[str, str] = {
    **dict.fromkeys(
        ["SD15_instructpix2pix", "SDXL_instructpix2pix", "SD21UnclipL", "SD21UnclipH",
         "SD_X4Upscaler", "LotusD", "Stable_Zero123", "SVD_img2vid", "SV3D_u", "SV3D_p"],
        _UNET_EXTRA,
    ),
    **dict.fromkeys(
        ["SDXLRefiner", "SSD1B", "KOALA_700M", "KOALA_1B", "Segmind_Vega"],
        "an SDXL UNet matched by fixed per-level transformer depths and widths (SDXL's own "
        "smallest is 566 MB, run as a big one; these not attempted)",
    ),
    "Stable_Cascade_C": _FIXED + "2048 (lite: 1536) wide, 24-deep levels; 1-3.6 B parameters",
    "Stable_Cascade_B": _FIXED + "320-1280 wide, 28-deep levels; 0.7-1.5 B parameters",
    "GenmoMochi": _FIXED + "48 blocks, 3072 wide (10 B parameters)",
    "HiDream": _FIXED + "16 + 32 layers, 20 heads of 128, 4 experts (17 B parameters)",
    "Omnigen2": _FIXED + "32 layers, 2520 wide (4 B parameters)",
    "ACEStep": _FIXED + "24 layers, 2560 wide (3.5 B parameters)",
    "Chroma": "core fixes its modulation approximator: 5 layers 5120 wide, 3072-wide outputs "
    "(0.28 B parameters), so the blocks are 3072 wide: 0.97 B parameters at 2 + 2 blocks",
    "ChromaRadiance": "as Chroma: core fixes its 5120-wide approximator and 3072-wide outputs",
    "SeedVR2": _FIXED + "its 3 B and 7 B layouts, chosen by key",
    "ZImage": "core's only Z-Image branch is 3840 wide, 30 heads: 1.08 B parameters at 2 layers",
    "ZImagePixelSpace": "as ZImage: 3840 wide, 30 heads",
    "Kandinsky5Image": "core matches it by its width, 2560",
    "AuraFlow": "core reads layer counts and widths of its inputs, not its own: 3072 wide, "
    "12 heads; its smallest build is 546 M parameters",
    **dict.fromkeys(["PiD", "PixelDiTT2I", "HiDreamO1", "ErnieImage", "TripoSplat"], _DEFAULTS),
    **dict.fromkeys(
        ["WAN21_CausalAR_T2V", "WAN21_Camera", "WAN22_Camera", "WAN22_S2V", "WAN21_HuMo",
         "WAN22_Animate", "WAN_Animate2", "WAN21_FlowRVS", "WAN21_SCAIL", "WAN21_SCAIL2",
         "WAN22_WanDancer"],
        _WAN_EXTRA,
    ),
    **dict.fromkeys(["StableAudio", "StableAudio3", "ACEStep15", "MiniMaxMusic3"], _AUDIO),
    **dict.fromkeys(["LTXAV", "MiniMaxH3"], "an audio-video model: its latent packs both (not "
                    "attempted; LTXV runs the same video blocks)"),
    **dict.fromkeys(["Hunyuan3Dv2", "Hunyuan3Dv2mini", "Hunyuan3Dv2_1", "Trellis2"], _3D),
    **dict.fromkeys(["Boogu", "MageFlow", "JoyImage", "Ideogram4", "Krea2", "Lens"], _NEW),
    **dict.fromkeys(
        ["RT_DETR_v4", "SAM3", "SAM31", "DepthAnything3"],
        "not a diffusion model: detection, segmentation or depth, no KSampler",
    ),
    "CosmosI2V": "Cosmos 1 with 17 input channels: the same 412 MB network as cosmos_1 (not "
    "built twice)",
    "HunyuanImage21Refiner": "a HunyuanVideo variant (3-D patches, no vector input) not attempted",
    "HunyuanDiT1": "HunyuanDiT with size and style conditions (not attempted; HunyuanDiT runs)",
    "PixArtAlpha": "PixArt with micro-conditions (not attempted; PixArt Sigma runs)",
    **dict.fromkeys(["CogVideoX_I2V", "CogVideoX_Inpaint"], "CogVideoX with concat latents "
                    "(not attempted; CogVideoX T2V runs)"),
}  # fmt: skip


def main(comfy_dir: str, models_dir: str, names: list[str]) -> None:
    sys.path.insert(0, comfy_dir)
    import comfy.cli_args

    comfy.cli_args.args.cpu = True  # before comfy.model_management is imported: no CUDA probe
    out: dict[str, dict[str, Any]] = {}
    dm = os.path.join(models_dir, "diffusion_models")
    os.makedirs(dm, exist_ok=True)
    for name in names or list(ARCHS):
        spec = ARCHS[name]
        try:
            out[name] = build(name, spec, dm)
        except Exception as e:  # reported per architecture: the sweep goes on
            out[name] = {"skip": f"not built in this core: {type(e).__name__}: {e}"}
        print(name, out[name].get("skip") or out[name]["file"], flush=True)
    for name, why in SKIP.items():
        out.setdefault(name, {"skip": why})
    with open(os.path.join(models_dir, "arch-sweep.json"), "w") as f:
        json.dump(out, f, indent=1)


def build(name: str, spec: dict[str, Any], dm: str) -> dict[str, Any]:
    """Builds ``spec``; where this core's detection reads the file as another size (a core
    that fixes a size the spec leaves small, or leaves a class default), builds once more at
    the size core reads, so the file is this core's smallest of the architecture."""
    import comfy.model_detection
    import comfy.supported_models
    from safetensors.torch import save_file

    if not hasattr(comfy.supported_models, spec["config"]):
        return {"skip": f"this core has no {spec['config']}"}
    unet, resized = dict(spec["unet"]), False
    while True:
        config = comfy.model_detection.model_config_from_unet_config(unet)
        if type(config).__name__ != spec["config"]:
            return {"skip": f"core took the config for {type(config).__name__}"}
        sd = _random_state_dict(config)
        detected, why = _detected(sd, spec["config"])
        if detected is None or why is None or resized:
            break
        unet, resized = dict(detected.unet_config), True
        unet.pop("dtype", None)
    if why is not None:
        return {"skip": why}
    size = sum(t.numel() * t.element_size() for t in sd.values())
    if size > MAX_BYTES and not spec.get("big"):
        fixed = ": its detection fixes sizes the spec leaves small" if resized else ""
        return {"skip": f"this core's smallest build of it is {size / 2**20:.0f} MiB{fixed}"}
    file = f"ferry-arch-{name}.safetensors"
    save_file(sd, os.path.join(dm, file))
    return {"file": file, "cond": spec["cond"], "latent": spec["latent"]}


def _random_state_dict(config: Any) -> dict[str, Any]:
    """The network ``config`` builds, with seeded random weights, in bf16."""
    import torch

    config.set_inference_dtype(torch.float32, None)
    # torch.empty fills NaN in deterministic mode: a buffer core leaves empty (a position
    # embedding the checkpoint fills) is told from one it computes.
    torch.use_deterministic_algorithms(True)
    try:
        net = _get_model(config).diffusion_model
    finally:
        torch.use_deterministic_algorithms(False)
    params = dict(net.named_parameters())
    sd = {}
    for k, v in net.state_dict().items():
        if k in params or (v.is_floating_point() and v.isnan().any()):
            v = _random(k, tuple(v.shape))
        sd[k] = v.detach().contiguous()
    # float32 (what core computes in on a CPU: the disk tier reads it straight from the file)
    # unless that is big; then bf16, as most checkpoints are (cast as it is read)
    if sum(t.numel() * t.element_size() for t in sd.values()) > FP32_BYTES:
        sd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}
    return sd


def _get_model(config: Any) -> Any:
    """``config.get_model``; a key this core's network does not take (the specs are written
    for the newest core) is dropped, as this core's detection would not have set it."""
    import re

    while True:
        try:
            return config.get_model({}, "")
        except TypeError as e:
            unknown = re.search(r"unexpected keyword argument '(\w+)'", str(e))
            if unknown is None or unknown.group(1) not in config.unet_config:
                raise
            del config.unet_config[unknown.group(1)]


def _random(key: str, shape: tuple[int, ...]) -> Any:
    """Seeded by the key: norms near 1, biases and 1-D tensors small, matrices 1/sqrt(fan-in)."""
    import torch

    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    t = torch.randn(shape, generator=g)
    if len(shape) >= 2:
        return t / (max(1, t[0].numel()) ** 0.5)
    if key.endswith((".weight", ".scale", "gamma")):
        return 1.0 + 0.05 * t
    return 0.02 * t


def _detected(sd: dict[str, Any], want: str) -> tuple[Any | None, str | None]:
    """Core's detection of ``sd`` and why it would not rebuild this network (None: it would)."""
    import comfy.model_detection
    import torch

    config = comfy.model_detection.model_config_from_unet(sd, "")
    got = type(config).__name__ if config is not None else None
    if got != want:
        return None, f"core's detection takes this file for {got}, not {want}"
    config.set_inference_dtype(torch.bfloat16, None)
    try:
        again = config.get_model({}, "", device=torch.device("meta")).diffusion_model
    except (ValueError, TypeError, RuntimeError, AssertionError) as e:
        # e.g. a width read from the file with a head count core fixes
        return None, f"this core's detection fixes sizes a small file cannot have: {e}"
    again = again.state_dict()
    loaded = config.process_unet_state_dict(dict(sd))
    shapes = {k: tuple(v.shape) for k, v in again.items()}
    ours = {k: tuple(v.shape) for k, v in loaded.items()}
    if shapes != ours:
        diff = sorted(set(shapes.items()) ^ set(ours.items()))[:3]
        return config, f"core's detection builds other shapes from this file: {diff}"
    return config, None


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
