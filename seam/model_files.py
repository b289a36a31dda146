"""Which file a host's loader left a model's weights in, where the host does not say.

ComfyUI-GGUF's loader maps the .gguf and wraps each tensor's bytes in place (GGMLTensor), and
keeps no path on the model. The disk tier can read the unchanged groups straight from that
file (formats/gguf.py) instead of writing copies, so the file is found from the weights
themselves: the mapping their bytes live in. A wrong answer costs nothing but a copy: the
disk tier compares each group's bytes with the file's before it reads the group from it.
"""

from __future__ import annotations

from torch import nn

from ..offload_core.disk.files import files


def gguf_file_of(module: nn.Module) -> str | None:
    """The .gguf file the module's GGUF weights (those with a ``tensor_type``) are mapped
    from; None where they are not views of one (copied to RAM, moved, not GGUF)."""
    for p in module.parameters():
        if getattr(p, "tensor_type", None) is None or p.device.type != "cpu":
            continue
        path = files().mapped_file(p.untyped_storage().data_ptr())
        return str(path) if path is not None and path.suffix == ".gguf" else None
    return None
