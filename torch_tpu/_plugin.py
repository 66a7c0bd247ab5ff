"""Finding the PJRT plugin that device `tpu` runs on.

Order: ``TORCH_TPU_PJRT_PLUGIN`` (a path) wins; else libtpu when installed and a
TPU is present; else the CUDA plugin when installed and a GPU is visible; else
the XLA CPU plugin package (``lammps-jax-pjrt-cpu``, or ``fastatomstruct-xla-cpu``).
"""
import glob
import importlib.util
import os

__all__ = ["find_plugin"]


def _platform_from_path(path):
    name = os.path.basename(path).lower()
    if "tpu" in name:
        return "tpu"
    if "cuda" in name or "gpu" in name:
        return "cuda"
    return "cpu"


def _package_dir(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _tpu_present():
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _gpu_visible():
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def attached_socket():
    """The device owner's socket this process attaches to (TORCH_TPU_OWNER: a path, or 1 for the
    default one), or None."""
    owner = os.environ.get("TORCH_TPU_OWNER", "")
    if owner in ("", "0"):
        return None
    if owner == "1":
        from .owner import default_socket

        return default_socket()
    return owner


def find_plugin():
    """Returns (path, platform) of the plugin to load, or raises RuntimeError."""
    sock = attached_socket()
    if sock:  # the owner's devices, through our forwarding plugin (torch_tpu/owner.py)
        os.environ["TORCH_TPU_OWNER_SOCKET"] = sock
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtt_remote_pjrt.so"), "remote"
    path = os.environ.get("TORCH_TPU_PJRT_PLUGIN")
    if path:
        if not os.path.exists(path):
            raise RuntimeError(f"TORCH_TPU_PJRT_PLUGIN={path} does not exist")
        return path, os.environ.get("TORCH_TPU_PJRT_PLATFORM", _platform_from_path(path))
    d = _package_dir("libtpu")
    if d and os.path.exists(os.path.join(d, "libtpu.so")) and _tpu_present():
        return os.path.join(d, "libtpu.so"), "tpu"
    if _gpu_visible():
        for pkg in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
            d = _package_dir(pkg)
            if d and os.path.exists(os.path.join(d, "xla_cuda_plugin.so")):
                return os.path.join(d, "xla_cuda_plugin.so"), "cuda"
    try:
        import lammps_jax_pjrt_cpu

        return str(lammps_jax_pjrt_cpu.PLUGIN_PATH), "cpu"
    except ImportError:
        pass
    d = _package_dir("fastatomstruct_xla_cpu")
    if d:
        hits = glob.glob(os.path.join(d, "**", "libpjrt_cpu.so"), recursive=True)
        if hits:
            return hits[0], "cpu"
    raise RuntimeError(
        "torch_tpu found no PJRT plugin: install lammps-jax-pjrt-cpu (CPU), jax-cuda13-pjrt (NVIDIA GPU) "
        "or libtpu (Cloud TPU), or set TORCH_TPU_PJRT_PLUGIN=/path/to/plugin.so"
    )


# ---- the one-process rule (TORCH_TPU_EXCLUSIVE=1)
# A Cloud TPU's chips are opened by one process at a time (libtpu refuses a second one). With
# TORCH_TPU_EXCLUSIVE=1 every plugin behaves so: the process that creates the client holds an
# exclusive lock on its platform's devices until it exits (or dies: the kernel drops the lock),
# and another process of the same user gets an error naming the owner instead of a second client.
_device_lock = None  # the open lock file, held for the life of the process


def _lock_path(platform):
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    d = os.path.join(base, f"torch_tpu-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    visible = os.environ.get("TPU_VISIBLE_CHIPS") or os.environ.get("CUDA_VISIBLE_DEVICES") or "all"
    return os.path.join(d, f"{platform}-{visible.replace(',', '_').replace('/', '_')}.lock")


def claim_devices(platform, force=False, note=None):
    """Takes the platform's devices for this process when TORCH_TPU_EXCLUSIVE=1 or `force` (else
    does nothing; a process attached to a device owner never does); raises RuntimeError naming
    the process that holds them. `note` is added to this process's line in the lock file."""
    global _device_lock
    if _device_lock is not None:
        if note:
            _describe(_device_lock, note)
        return
    if platform == "remote":
        return
    if not force and os.environ.get("TORCH_TPU_EXCLUSIVE", "0") in ("", "0"):
        return
    import fcntl

    path = _lock_path(platform)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        owner = f.read().strip() or "another process"
        f.close()
        raise RuntimeError(
            f"the {platform} devices are in use by {owner}: one process opens a device "
            f"(TORCH_TPU_EXCLUSIVE=1, the rule a Cloud TPU enforces; lock {path}). Stop that "
            "process, or run the processes attached to one device owner (`python -m torch_tpu.owner`, "
            "then TORCH_TPU_OWNER=1 in each), or unset TORCH_TPU_EXCLUSIVE to share the devices.") from None
    _describe(f, note)
    _device_lock = f


def _describe(f, note):
    """This process, as the lock file names it to a process that is refused."""
    import sys

    f.seek(0)
    f.truncate(0)
    f.write(f"process {os.getpid()} ({' '.join(sys.argv)[:200] or sys.executable})" + (f", {note}" if note else ""))
    f.flush()
