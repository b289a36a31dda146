"""What every host of Ferry does the same way (ComfyUI's ``nodes/``, Forge's ``webui/``):
neither host is imported here, only offload_core, so a host is an adapter to its own API."""
