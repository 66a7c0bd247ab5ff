"""torch.distributed on `tpu`: the c10d backend ``tpu_dist`` (also registered as ``tpu``).

Registered with ``devices=["tpu"]``, so ``init_process_group()`` and
``init_device_mesh("tpu", ...)`` pick it for tpu tensors. ``init_process_group()``
without a backend (and ``device_id`` None or a tpu device) means
``"cpu:gloo,tpu:tpu_dist"``: CPU tensors keep using stock gloo.

v1 stages tpu tensors through host memory to a ProcessGroupGloo the backend owns
(``csrc/aten/distributed/distributed.cpp``); it works on every PJRT plugin, including the XLA CPU
plugin, which cannot run collectives across processes.

Environment:
  TORCH_TPU_DIST_CHECKS=0  skip the per-call agreement check (one small all-gather per
                           collective that turns mismatched calls into errors on every rank
                           instead of a gloo abort or a hang).
"""
import functools
import os
import sys

import torch

__all__ = ["BACKEND_NAMES", "is_registered", "DEFAULT_BACKEND"]

BACKEND_NAMES = ("tpu_dist", "tpu")
DEFAULT_BACKEND = "cpu:gloo,tpu:tpu_dist"


def _create_backend(store, rank, size, timeout):
    """c10d creator: a gloo backend on the same store, wrapped by the tpu backend."""
    import torch.distributed as dist

    from . import _C

    gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
    gloo._set_sequence_number_for_group()
    checks = os.environ.get("TORCH_TPU_DIST_CHECKS", "1") != "0"
    return _C._tpu_dist_backend(gloo, rank, size, checks, timeout.total_seconds())


def is_registered():
    import torch.distributed as dist

    return dist.is_available() and "TPU_DIST" in dist.Backend._plugins


def _tpu_is_accelerator():
    try:
        return torch._C._get_accelerator().type == "tpu" and torch.tpu.is_available()
    except Exception:
        return False


def _wrap_init_process_group(orig):
    if getattr(orig, "_tpu_default_backend", False):
        return orig

    @functools.wraps(orig)
    def init_process_group(backend=None, *args, **kwargs):
        device_id = kwargs.get("device_id")
        if (
            backend is None
            and (device_id is None or torch.device(device_id).type == "tpu")
            and _tpu_is_accelerator()
        ):
            backend = DEFAULT_BACKEND
        return orig(backend, *args, **kwargs)

    init_process_group._tpu_default_backend = True
    return init_process_group


def _wrap_new_process_group_helper(orig):
    """A "cpu:gloo,tpu:tpu_dist" group gets gloo as its default backend, as an
    undefined-backend group does: PyTorch 2.13 looks for the first plugin's upper-case
    name among lower-case backend names and so leaves the default unset (barrier() then
    warns "No backend of type 0 found" at destroy_process_group)."""
    if getattr(orig, "_tpu_default_backend", False):
        return orig

    @functools.wraps(orig)
    def _new_process_group_helper(*args, **kwargs):
        pg, store = orig(*args, **kwargs)
        try:
            from torch.distributed import ProcessGroup

            if isinstance(pg, ProcessGroup) and pg._get_backend_name() == "undefined":
                devices = [d.type for d in pg._device_types]
                if "tpu" in devices:
                    kind = ProcessGroup.BackendType.GLOO if "cpu" in devices else ProcessGroup.BackendType.CUSTOM
                    pg._set_default_backend(kind)
        except Exception:  # a cosmetic fix: never let it break group creation
            pass
        return pg, store

    _new_process_group_helper._tpu_default_backend = True
    return _new_process_group_helper


def _register():
    import torch.distributed as dist

    from . import _C

    if not dist.is_available() or _C._tpu_dist_error is not None:
        return
    for name in BACKEND_NAMES:
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, _create_backend, devices=["tpu"])
    # init_process_group() without a backend: gloo for cpu, tpu_dist for tpu
    c10d = dist.distributed_c10d
    wrapped = _wrap_init_process_group(c10d.init_process_group)
    c10d.init_process_group = wrapped
    dist.init_process_group = wrapped
    c10d._new_process_group_helper = _wrap_new_process_group_helper(c10d._new_process_group_helper)
    mesh = sys.modules.get("torch.distributed.device_mesh")
    if mesh is not None and hasattr(mesh, "init_process_group"):
        mesh.init_process_group = wrapped
