"""torch_tpu: PyTorch device `tpu` on any PJRT plugin (TPU, NVIDIA GPU, or the XLA CPU plugin).

`import torch` loads this package through the `torch.backends` entry point; after
that, `torch.device("tpu")`, `tensor.tpu()` and `torch.tpu.*` work as their CUDA
counterparts do.
"""


def _autoload():
    """Entry point for torch's device-backend autoloading (the import does the work)."""


import contextlib as _contextlib
import enum as _enum
import os as _os
import warnings as _warnings

import torch

from . import _plugin
from . import device_module as _device_module

__all__ = ["EagerMode", "set_eager_mode", "get_eager_mode", "eager_mode", "metrics", "plugin_path",
           "mark_dynamic", "mark_static"]


class EagerMode(_enum.IntEnum):
    DEFER_NEVER = 0                      # Strict: each op runs at once, asynchronously
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 1  # Debug: each op runs and is waited for
    DEFER_AND_FUSE = 2                   # fused eager: ops are deferred and fused until a host read


def _cache_dir():
    """TORCH_TPU_CACHE_DIR (empty: no disk cache), else $XDG_CACHE_HOME/torch_tpu or ~/.cache/torch_tpu."""
    d = _os.environ.get("TORCH_TPU_CACHE_DIR")
    if d is not None:
        return d
    base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(base, "torch_tpu")


def _num_cpu_devices():
    """Devices of the XLA CPU plugin: TORCH_TPU_NUM_DEVICES, else one per local process
    under torchrun (LOCAL_WORLD_SIZE), so `tpu:{local_rank}` exists in every process as
    `cuda:{local_rank}` does; each process uses its own. Other plugins find their devices."""
    n = _os.environ.get("TORCH_TPU_NUM_DEVICES")
    if n is None:
        n = _os.environ.get("LOCAL_WORLD_SIZE", "1")
    return max(1, int(n))


def _default_accelerate_device():
    """HF accelerate picks its device from a fixed list of backends (cuda, xpu, npu, mps, ...;
    not torch.accelerator), else from ACCELERATE_TORCH_DEVICE (read by accelerate's PartialState;
    transformers' TrainingArguments reads it too). transformers finds tpu through torch.accelerator
    and puts the model on tpu:0, so without this Trainer's batches stay on CPU. Setting that knob
    (nothing of accelerate is patched) makes both agree on tpu:{LOCAL_RANK % device_count}, the
    index accelerate picks for cuda. A value the user set wins. Subprocesses inherit it: a value we
    set is also kept in TORCH_TPU_ACCELERATE_DEVICE, so a child (a torchrun worker) recomputes its
    own index. Caveat: while it is set, accelerate ignores `cpu=True`, so a CPU run with
    TrainingArguments(use_cpu=True) also needs ACCELERATE_TORCH_DEVICE=cpu."""
    ours = _os.environ.get("TORCH_TPU_ACCELERATE_DEVICE")
    current = _os.environ.get("ACCELERATE_TORCH_DEVICE")
    if current is not None and current != ours:
        return
    index = int(_os.environ.get("LOCAL_RANK", "0") or 0) % max(1, _device_module.device_count())
    _os.environ["ACCELERATE_TORCH_DEVICE"] = _os.environ["TORCH_TPU_ACCELERATE_DEVICE"] = f"tpu:{index}"


def _start():
    from . import _C

    if getattr(torch.utils, "_tpu_registered", False) or torch._C._get_privateuse1_backend_name() == "tpu":
        return
    # A normal run is quiet: the XLA plugins log INFO lines (and an absl notice) to stderr
    # when a client is created. Hide INFO unless the user chose a log level.
    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        path, platform = _plugin.find_plugin()
        _plugin.claim_devices(platform)  # TORCH_TPU_EXCLUSIVE=1: one process per device
        n = _num_cpu_devices()
        _C._init(str(path), platform, n)
    except Exception as e:  # the device stays unavailable; CPU PyTorch keeps working
        _device_module._init_error = str(e)
        _warnings.warn(f"torch_tpu: the tpu device is unavailable: {e}")
    torch.utils.rename_privateuse1_backend("tpu")
    if _device_module._init_error is None:
        _default_accelerate_device()
    torch._register_device_module("tpu", _device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    # tpu kernels written in Python at the key the backend owns (see each module)
    from . import _amp, _embedding_bag, _fbgemm, _flash_attention, _fused_optim, _grouped_mm, _torchrec

    global _aten_impls, _library_impls
    _aten_impls = torch.library.Library("aten", "IMPL")
    for module in (_grouped_mm, _fused_optim, _amp, _embedding_bag, _flash_attention):
        for op, kernel, key in module.KERNELS:
            _aten_impls.impl(op, kernel, key)
    # TorchRec's KeyedJaggedTensor ops and its UNFUSED_TPU lookups: fbgemm_gpu and TorchRec define
    # these namespaces when they are imported, if ever
    _library_impls = []
    for namespace, module in (("fbgemm", _fbgemm), ("torchrec", _torchrec)):
        _library_impls.append(torch.library.Library(namespace, "IMPL"))
        for op, kernel in module.KERNELS:
            _library_impls[-1].impl(op, kernel, "PrivateUse1")
    try:  # TPUs compute in bfloat16: make it autocast's default dtype for tpu
        torch.set_autocast_dtype("tpu", torch.bfloat16)
    except (AttributeError, RuntimeError):
        pass
    _C._set_cache_dir(_cache_dir())
    # device-side checks (out-of-range indices, ...), raised at the next host sync
    _C._set_device_checks(_os.environ.get("TORCH_TPU_DEVICE_CHECKS", "1") != "0")
    # the trace cache: TORCH_TPU_TRACE_CACHE=0 turns it off, =verify checks it
    tc = _os.environ.get("TORCH_TPU_TRACE_CACHE", "1")
    _C._set_tracing(tc != "0", tc == "verify")
    # DeferAndFuse keeps one graph across threads with TORCH_TPU_FUSE_ACROSS_THREADS=1
    # (less memory; by default a new thread's ops start a new graph so parts overlap)
    _C._set_fuse_split_threads(_os.environ.get("TORCH_TPU_FUSE_ACROSS_THREADS") != "1")
    if _os.environ.get("TORCH_TPU_FUSE_MAX_OPS"):
        _C._set_fuse_limit(int(_os.environ["TORCH_TPU_FUSE_MAX_OPS"]))
    # bounded dynamism: TORCH_TPU_DYNAMIC=0 turns the size policy off, TORCH_TPU_BUCKETS sets the ladder
    from . import dynamic as _dynamic

    _dynamic._configure()
    # torch.compile: the backend "tpu" (also the default backend; CPU graphs still go to Inductor)
    from . import _compile

    _compile.install_default_backend()
    # torch.distributed: the c10d backend "tpu_dist" (also "tpu"), see torch_tpu/distributed.py
    try:
        from . import distributed as _distributed

        _distributed._register()
    except Exception as e:  # tpu keeps working without it
        _warnings.warn(f"torch_tpu: the tpu_dist backend could not be registered: {e}")
    import atexit

    atexit.register(_flush_at_exit)
    prec = _os.environ.get("TORCH_TPU_MATMUL_PRECISION")
    if prec and _device_module._init_error is None:
        _device_module.set_matmul_precision(_device_module.Precision[prec.upper()])
    if _os.environ.get("TORCH_TPU_LAUNCH_BLOCKING") == "1":
        set_eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING)
    elif _os.environ.get("TORCH_TPU_DEFER_AND_FUSE") == "1":
        set_eager_mode(EagerMode.DEFER_AND_FUSE)


def _flush_at_exit():
    from . import _C

    try:
        if _C._is_initialized():
            _C.synchronize()
    except Exception:  # exit must not fail because of queued device work
        pass
    _let_autograd_threads_settle()


def _let_autograd_threads_settle(limit_s=1.0):
    """Gives autograd's device threads time to drop their last backward before Python
    finalizes. The thread that ran a backward on tpu releases the graph task after the
    caller has returned; the task holds a Python object (the context torch stashes for
    device threads), and a decref that finds the interpreter finalizing ends that thread
    inside a destructor: std::terminate, the process aborts at exit. A script that ends
    right after `loss.backward(); opt.step()` met that on a loaded machine. Sleeping
    releases the GIL, so a thread waiting for it finishes; we wait until no pt_autograd
    thread is runnable (Linux; elsewhere nothing to look at)."""
    import time

    try:
        ids = [t for t in _os.listdir("/proc/self/task") if _thread_comm(t).startswith("pt_autograd")]
    except OSError:
        return
    if not ids:
        return
    deadline, quiet = time.monotonic() + limit_s, 0
    while quiet < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
        quiet = 0 if any(_thread_state(t) == "R" for t in ids) else quiet + 1


def _thread_comm(tid):
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _thread_state(tid):
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def set_eager_mode(mode):
    from . import _C

    _C._set_mode(int(EagerMode(mode)))


def get_eager_mode():
    from . import _C

    return EagerMode(_C._get_mode())


@_contextlib.contextmanager
def eager_mode(mode):
    prev = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(prev)


def plugin_path():
    from . import _C

    return _C.plugin_path()


_start()

from . import metrics  # noqa: E402
from . import dynamic  # noqa: E402
from .dynamic import mark_dynamic, mark_static  # noqa: E402


def _install_printing():
    """Printing a tpu tensor formats a CPU copy (one transfer) instead of running
    the formatter's dozens of small ops on the device; the text is unchanged."""
    import torch._tensor_str as ts

    orig = ts._str_intern
    if getattr(orig, "_tpu", False):
        return

    def _str_intern(inp, *, tensor_contents=None):
        if (
            tensor_contents is None
            and isinstance(inp, torch.Tensor)
            and inp.device.type == "tpu"
            and inp.layout == torch.strided
            and inp.numel() > 0
            and type(inp) in (torch.Tensor, torch.nn.Parameter)
        ):
            with torch.no_grad():
                cpu = inp.detach().to("cpu")
            tensor_contents = ts._tensor_str(cpu, len("tensor("))
        return orig(inp, tensor_contents=tensor_contents)

    _str_intern._tpu = True
    ts._str_intern = _str_intern


_install_printing()

from . import kernels  # noqa: E402  (custom kernels; never imports JAX)
