"""vLLM platform plugin for device `tpu` (entry point group `vllm.platform_plugins`, name `torch_tpu`).

vLLM calls `register()` in every process it starts (the engine core, the API server) to learn
which platform class to use. It must stay cheap and device-free: it imports nothing of vLLM and
touches no device, because vLLM imports plugins while it resolves `current_platform` and a
PJRT client must never be created before vLLM forks or spawns its workers.

`import torch_tpu` never imports this package (torch autoloads torch_tpu, vLLM imports torch:
the two would import each other).
"""


def register() -> str | None:
    """The platform's qualified name when `tpu` can be used, else None (vLLM then tries others)."""
    import importlib.util

    if importlib.util.find_spec("torch_tpu._C") is None:
        return None
    return "torch_tpu.vllm.platform.TpuPlatform"
