"""The loader hook Ray Train calls before ``init_process_group("tpu_dist")``.

Ray's ``TPUTorchDeviceManager.register_custom_torch_dist_backend`` imports this module and calls
``load()``. Importing torch_tpu already registers the device and the ``tpu_dist`` c10d backend
(torch autoloads it); ``load`` checks that both are there, and raises why one is missing where
Ray would otherwise meet an unknown backend name.
"""


def load() -> None:
    import torch.distributed as dist

    from . import _C, device_module

    if device_module._init_error is not None:
        raise RuntimeError(f"torch_tpu: the tpu device is unavailable: {device_module._init_error}")
    if _C._tpu_dist_error is not None:
        raise RuntimeError(f"torch_tpu: the tpu_dist c10d backend is unavailable: {_C._tpu_dist_error}")
    if "TPU_DIST" not in dist.Backend._plugins:
        raise RuntimeError("torch_tpu: the tpu_dist c10d backend could not be registered")
