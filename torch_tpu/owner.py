"""The device owner: one process opens the devices, others of the same user attach to it.

A Cloud TPU lets one process open its chips (torch_tpu enforces the same on every plugin with
``TORCH_TPU_EXCLUSIVE=1``). To run several processes on one device (a trainer and a rollout
engine as two Ray actors, say), start an owner and attach the others to it::

    python -m torch_tpu.owner &                 # opens the devices, serves them on a socket
    TORCH_TPU_OWNER=1 python trainer.py         # "tpu" is the owner's devices
    TORCH_TPU_OWNER=1 python rollouts.py

``TORCH_TPU_OWNER`` is the owner's socket path, or ``1`` for the default one
(``$XDG_RUNTIME_DIR`` or ``/tmp``, then ``torch_tpu-<uid>/owner-<visible devices>.sock``). An
attached process runs torch on ``tpu`` unchanged: its programs are compiled and run by the owner
(through ``libtt_remote_pjrt.so``, a PJRT plugin that forwards each call over the socket), and its
tensors live in the owner's device memory. Only processes of the owner's user may attach (a
0600 socket in a 0700 directory, and the peer's credentials checked); each sees only its own
buffers, and those another one shared with it::

    handle = torch_tpu.owner.share(tensor)      # in one process: a small picklable handle
    tensor = handle.open()                      # in another: the same device memory, no copy

If the owner dies, every attached process gets a RuntimeError naming it at its next tpu call.
"""
import argparse
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

__all__ = ["default_socket", "share", "SharedTensor", "main"]


def default_socket():
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    d = os.path.join(base, f"torch_tpu-{os.getuid()}")
    visible = os.environ.get("TPU_VISIBLE_CHIPS") or os.environ.get("CUDA_VISIBLE_DEVICES") or "all"
    return os.path.join(d, f"owner-{visible.replace(',', '_').replace('/', '_')}.sock")


@dataclass(frozen=True)
class SharedTensor:
    """A tensor of one attached process, as another attached process of the same owner opens it:
    `open()` gives a tensor over the same device memory (a snapshot: later in-place updates on
    either side write new buffers and are not seen by the other)."""

    token: str
    sizes: tuple
    strides: tuple
    offset: int
    dtype: object  # torch.dtype
    nbytes: int
    storage_dtype: int
    device: int

    def open(self):
        from . import _C

        return _C._open_shared(self.token, list(self.sizes), list(self.strides), self.offset, self.dtype,
                               self.nbytes, self.storage_dtype, self.device)


def share(tensor):
    """A `SharedTensor` for `tensor` (on tpu, in a process attached to a device owner)."""
    from . import _C

    if tensor.device.type != "tpu":
        raise ValueError(f"torch_tpu.owner.share: the tensor is on {tensor.device}, not tpu")
    token, nbytes, storage_dtype = _C._share_storage(tensor)
    return SharedTensor(token, tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(),
                        tensor.dtype, nbytes, storage_dtype, tensor.device.index or 0)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torch_tpu.owner",
                                 description="Open the tpu devices and serve them to other processes of this user.")
    ap.add_argument("--socket", default=None, help=f"the socket path (default {default_socket()})")
    args = ap.parse_args(argv)

    import torch

    from . import _C, _plugin
    from . import device_module as dm

    if os.environ.get("TORCH_TPU_OWNER"):
        raise SystemExit("torch_tpu.owner: TORCH_TPU_OWNER is set: an owner opens the devices itself; unset it")
    if not torch.tpu.is_available():
        raise SystemExit(f"torch_tpu.owner: no tpu device: {dm._init_error}")
    path = args.socket or default_socket()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    platform = _C.platform_name()
    try:
        _plugin.claim_devices(platform, force=True, note=f"a device owner: attach with TORCH_TPU_OWNER={path}")
    except RuntimeError as e:
        raise SystemExit(f"torch_tpu.owner: {e}")

    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(path)
            raise SystemExit(f"torch_tpu.owner: another device owner serves on {path}")
        except OSError:
            os.unlink(path)  # a stale socket: its owner is gone
        finally:
            probe.close()
    server = threading.Thread(target=_serve, args=(path,), daemon=True)
    server.start()
    while not os.path.exists(path) and server.is_alive():  # listening before we say so
        time.sleep(0.01)
    signal.signal(signal.SIGTERM, lambda *_: _C._stop_serving())
    if not server.is_alive():
        raise SystemExit(f"torch_tpu.owner: {_error[0] if _error else 'the server stopped'}")
    print(f"torch_tpu.owner: process {os.getpid()} serves {torch.tpu.device_count()} {platform} device(s) "
          f"on {path}", file=sys.stderr, flush=True)
    try:
        while server.is_alive():
            server.join(0.5)
    except KeyboardInterrupt:
        _C._stop_serving()
        server.join(35)
    if _error:
        raise SystemExit(f"torch_tpu.owner: {_error[0]}")


_error = []


def _serve(path):
    from . import _C

    try:
        _C._serve_devices(path)
    except Exception as e:  # reported by main
        _error.append(str(e))


if __name__ == "__main__":
    main()
