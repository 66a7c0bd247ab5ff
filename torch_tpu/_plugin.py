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


def find_plugin():
    """Returns (path, platform) of the plugin to load, or raises RuntimeError."""
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
