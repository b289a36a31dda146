"""API-format workflows for the real-ComfyUI suite, and a client that runs them.

A workflow is a dict {node id: {"class_type": ..., "inputs": {...}}}; links are [id, output].
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

MODEL_FILE = "ferry-tiny-sd3.safetensors"
LORA_FILE = "ferry-tiny-lora.safetensors"


def graph(
    model_chain: list[tuple[str, dict[str, Any]]],
    prefix: str,
    *,
    loader: tuple[str, dict[str, Any]] | None = None,
    seed: int = 7,
    steps: int = 3,
    latent: tuple[str, dict[str, Any]] | None = None,
    cond: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Loader -> each (class_type, inputs) of model_chain in turn -> KSampler -> SaveLatent.
    ``latent``: the empty-latent node (default: a 128 x 128 SD3 latent); ``cond``: more inputs
    for the test conditioning (its context and pooled widths)."""
    cls, inputs = loader or ("UNETLoader", {"unet_name": MODEL_FILE, "weight_dtype": "default"})
    g: dict[str, Any] = {"1": {"class_type": cls, "inputs": inputs}}
    prev = ["1", 0]
    for i, (cls, inputs) in enumerate(model_chain):
        nid = str(10 + i)
        g[nid] = {"class_type": cls, "inputs": {"model": prev, **inputs}}
        prev = [nid, 0]
    g["2"] = {"class_type": "FerryTestConditioning", "inputs": {"seed": 1, **(cond or {})}}
    g["3"] = {"class_type": "FerryTestConditioning", "inputs": {"seed": 2, **(cond or {})}}
    cls, inputs = latent or ("EmptySD3LatentImage", {"width": 128, "height": 128, "batch_size": 1})
    g["4"] = {"class_type": cls, "inputs": inputs}
    g["5"] = {
        "class_type": "KSampler",
        "inputs": {
            "model": prev, "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0],
            "seed": seed, "steps": steps, "cfg": 2.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0,
        },
    }  # fmt: skip
    g["6"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["5", 0], "filename_prefix": prefix},
    }
    return g


def ferry(**over: Any) -> tuple[str, dict[str, Any]]:
    inputs = {
        "use_panel_settings": False, "level": "block", "blocks_per_group": 1, "tier": "ram",
        "disk_path": "", "prefetch_depth": 1, "vram_budget": "",
    }  # fmt: skip
    inputs.update(over)
    return ("FerryOffloadModel", inputs)


#: Every setting the planner chooses, on "auto" (issue 37).
AUTO = {"tier": "auto", "blocks_per_group": "auto", "prefetch_depth": "auto", "vram_budget": "auto"}


def lora(strength: float = 1.0) -> tuple[str, dict[str, Any]]:
    return ("LoraLoaderModelOnly", {"lora_name": LORA_FILE, "strength_model": strength})


class Client:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.client_id = uuid.uuid4().hex

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def live(self) -> list[dict[str, Any]]:
        """Ferry's live layouts in the server (its /ferry/stats)."""
        return self.get("/ferry/stats")["offloads"]  # type: ignore[no-any-return]

    def unload_models(self, within_s: float) -> None:
        """ComfyUI's "Unload models", then waits up to ``within_s`` for no Ferry layout to be
        left (the prompt worker frees between prompts, not the request).

        /free is asked again every second while a layout is left: POST /free only sets a flag
        and notifies the prompt worker's queue (PromptQueue.set_flag), and a notify that comes
        while the worker is not waiting on the queue (it is still finishing the last prompt:
        its history is already written, then it registers outputs and collects garbage) is
        lost; the worker then sleeps until the next prompt or its timeout (1000 s when no
        collection is due) before it reads the flag. A second request, like a user's second
        click, wakes it. A layout Ferry kept after ComfyUI's unload ran stays listed all the
        same, and fails here."""
        deadline = time.monotonic() + within_s
        while True:
            assert self.post("/free", {"unload_models": True})[0] == 200
            asked = time.monotonic()
            while self.live() and time.monotonic() - asked < 1.0:
                time.sleep(0.1)
            if not self.live():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"still laid out {within_s} s after /free: {self.live()}")

    def queue(self, g: dict[str, Any]) -> tuple[int, Any]:
        return self.post("/prompt", {"prompt": g, "client_id": self.client_id})

    def run(self, g: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
        """Queues ``g`` and waits for its history entry (status 'success' or 'error')."""
        status, body = self.queue(g)
        if status != 200:
            raise AssertionError(f"prompt rejected ({status}): {json.dumps(body)[:2000]}")
        return self.wait(body["prompt_id"], timeout)

    def wait(self, pid: str, timeout: float = 300) -> dict[str, Any]:
        """Waits for prompt ``pid``'s history entry (status 'success' or 'error')."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            hist = self.get(f"/history/{pid}")
            if pid in hist and hist[pid].get("status", {}).get("completed") is not None:
                entry = hist[pid]
                if entry["status"].get("status_str") in ("success", "error"):
                    return entry
            time.sleep(0.2)
        raise TimeoutError(f"prompt {pid} did not finish in {timeout} s")


def error_message(entry: dict[str, Any]) -> str:
    for kind, data in entry.get("status", {}).get("messages", []):
        if kind == "execution_error":
            return f"{data.get('node_type')}: {data.get('exception_message')}"
    return ""


def saved_latent_name(entry: dict[str, Any]) -> str:
    for out in entry.get("outputs", {}).values():
        for item in out.get("latents", []):
            return item["filename"]
    raise AssertionError(f"no latent saved: {json.dumps(entry)[:1000]}")
