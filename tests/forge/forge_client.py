"""A small client of Forge's API (``/sdapi/v1/txt2img``, ``img2img``) and Ferry's ``/ferry/stats``.

Every generation is 64x64, 2 Euler steps, CFG 5, a fixed seed, no PNG text chunk
(``enable_pnginfo`` off), so two images are equal exactly when their PNG bytes are. Each
result also carries the latents the sampler returned (the suite's test extension serves them):
``Image.same_as`` compares both, the latents byte for byte, which the 8-bit image could hide.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

CKPT_A = "ferry-sd15-a.safetensors"
CKPT_B = "ferry-sd15-b.safetensors"
LORA_PROMPT = "a ferry at dusk <lora:ferry-lora:1>"
PROMPT = "a ferry at dusk"
SCRIPT = "ferry offload"


def ferry(
    tier: str = "ram",
    level: str = "block",
    blocks: int = 1,
    disk: str = "",
    look_ahead: int = 1,
    budget: str = "",
    use_saved: bool = False,
    enabled: bool = True,
    text_encoder: bool = False,
) -> list[Any]:
    """The accordion's values, in its controls' order (webui/controls.py: CONTROLS)."""
    return [enabled, level, blocks, tier, disk, look_ahead, budget, use_saved, text_encoder]


@dataclass
class Image:
    png: bytes
    info: dict[str, Any]
    latents: bytes  # what the sampler returned, before the VAE (tests/forge/latents_ext)
    cond: bytes = b""  # the prompt's conditioning the sampler was given (the text encoder's)

    def same_as(self, other: Image) -> bool:
        return self.png == other.png and self.latents == other.latents

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.png).hexdigest()[:16]

    @property
    def infotext(self) -> str:
        return str(self.info["infotexts"][0])

    def pixels(self) -> Any:
        from PIL import Image as PilImage

        return PilImage.open(io.BytesIO(self.png))


class GenerationError(AssertionError):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"generation failed ({status}): {json.dumps(body)[:2000]}")
        self.status = status
        self.body = body

    @property
    def message(self) -> str:
        b = self.body if isinstance(self.body, dict) else {}
        return str(b.get("message") or b.get("errors") or b.get("detail") or "")


class Forge:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return json.loads(r.read())

    def post(self, path: str, body: Any, timeout: float = 1800) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw or b"null")
            except json.JSONDecodeError:
                return e.code, raw.decode(errors="replace")

    def txt2img(
        self, ferry_args: list[Any] | None = None, *, ckpt: str = CKPT_A, prompt: str = PROMPT,
        seed: int = 1,
    ) -> Image:  # fmt: skip
        return self._generate("txt2img", ferry_args, ckpt=ckpt, prompt=prompt, seed=seed)

    def img2img(
        self, ferry_args: list[Any] | None = None, *, init: bytes, denoise: float = 0.6,
        ckpt: str = CKPT_A, seed: int = 1,
    ) -> Image:  # fmt: skip
        """``init`` (PNG bytes) redrawn at ``denoise``, same size and sampler as txt2img."""
        extra = {"init_images": [base64.b64encode(init).decode()], "denoising_strength": denoise}
        return self._generate("img2img", ferry_args, ckpt=ckpt, prompt=PROMPT, seed=seed, **extra)

    def _generate(
        self, mode: str, ferry_args: list[Any] | None, *, ckpt: str, prompt: str, seed: int,
        **extra: Any,
    ) -> Image:  # fmt: skip
        body: dict[str, Any] = {
            "prompt": prompt, "negative_prompt": "", "seed": seed, "steps": 2, "width": 64,
            "height": 64, "cfg_scale": 5, "sampler_name": "Euler", "scheduler": "Automatic",
            "override_settings": {"sd_model_checkpoint": ckpt, "enable_pnginfo": False},
            "override_settings_restore_afterwards": False, **extra,
        }  # fmt: skip
        if ferry_args is not None:
            body["alwayson_scripts"] = {SCRIPT: {"args": ferry_args}}
        status, out = self.post(f"/sdapi/v1/{mode}", body)
        if status != 200:
            raise GenerationError(status, out)
        lat = self.get("/ferry-test/latents")
        return Image(
            base64.b64decode(out["images"][0]),
            json.loads(out["info"]),
            base64.b64decode(lat["data"]),
            base64.b64decode(lat["cond"]),
        )

    def stats(self) -> dict[str, Any]:
        return dict(self.get("/ferry/stats"))
