"""A test-only Forge extension (tests/forge links it into the data folder's extensions/): keeps
the last generation's latents, before the VAE, and the prompt's conditioning the sampler was
given (what the text encoder computed: p.c, the first prompt's first schedule), and serves them
at GET /ferry-test/latents, so the suite compares what the UNet and the text encoder computed
exactly (torch.equal on the bytes), not only the 8-bit image. Not part of Ferry."""

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
        cond = p.c.batch[0][0].schedules[0].cond  # prompt_parser.MulticondLearnedConditioning
        if isinstance(cond, dict):  # SDXL, Flux: {"crossattn": ..., "vector": ...}
            cond = cond["crossattn"]
        c = cond.detach().to("cpu").contiguous()
        _last.update(cond_shape=list(c.shape), cond=c.float().numpy().tobytes())


def _latents():
    if not _last:
        return {"shape": None}
    return {
        **_last,
        "data": base64.b64encode(_last["data"]).decode(),
        "cond": base64.b64encode(_last.get("cond", b"")).decode(),
    }


script_callbacks.on_app_started(
    lambda demo, app: app.add_api_route("/ferry-test/latents", _latents, methods=["GET"])
)
