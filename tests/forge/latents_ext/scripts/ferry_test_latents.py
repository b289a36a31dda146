"""A test-only Forge extension (tests/forge links it into the data folder's extensions/): keeps
the last generation's latents, before the VAE, and serves them at GET /ferry-test/latents, so
the suite compares what the UNet computed exactly (torch.equal on the bytes), not only the
8-bit image. Not part of Ferry."""

import base64

from modules import script_callbacks, scripts

_last = {}


class FerryTestLatents(scripts.Script):
    sorting_priority = 1000

    def title(self):
        return "ferry test latents"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, is_img2img):
        return []

    def post_sample(self, p, ps, *args):
        t = ps.samples.detach().to("cpu").contiguous()
        _last.update(shape=list(t.shape), dtype=str(t.dtype), data=t.numpy().tobytes())


def _latents():
    if not _last:
        return {"shape": None}
    return {**_last, "data": base64.b64encode(_last["data"]).decode()}


script_callbacks.on_app_started(
    lambda demo, app: app.add_api_route("/ferry-test/latents", _latents, methods=["GET"])
)
