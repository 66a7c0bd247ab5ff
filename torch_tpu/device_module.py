"""The `torch.tpu` module: the device API a CUDA user expects, for device `tpu`."""
import contextlib
import enum
import threading

import torch

from . import _C

__all__ = [
    "is_available", "device_count", "current_device", "set_device", "device", "synchronize",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all", "is_bf16_supported", "get_amp_supported_dtype",
    "get_device_name", "get_device_properties", "Stream", "Event", "current_stream", "default_stream", "stream",
    "empty_cache", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "memory_stats",
    "memory_reserved", "max_memory_reserved", "mem_get_info",
    "is_initialized", "init", "Precision", "set_matmul_precision", "get_matmul_precision", "precision",
]

_init_error = None  # set by torch_tpu when the runtime could not start


def is_available():
    return _init_error is None and _C._is_initialized() and _C.device_count() > 0


def is_initialized():
    return _C._is_initialized()


def init():
    _lazy_init()


def _lazy_init():
    if _init_error is not None:
        raise RuntimeError(f"torch_tpu could not start its PJRT runtime: {_init_error}")


def device_count():
    return _C.device_count() if _init_error is None else 0


def _index(device):
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        return current_device() if device.index is None else device.index
    raise ValueError(f"Invalid device: {device!r}")


def current_device():
    return _C.current_device()


def set_device(device):
    _lazy_init()
    _C.set_device(_index(device))


class device:
    """Context manager that changes the current tpu device."""

    def __init__(self, device):
        self.idx = _index(device) if device is not None else -1
        self.prev = -1

    def __enter__(self):
        self.prev = current_device()
        if self.idx >= 0:
            set_device(self.idx)

    def __exit__(self, *exc):
        if self.idx >= 0:
            set_device(self.prev)
        return False


def synchronize(device=None):
    """Waits for all queued tpu work (flushing any deferred ops first)."""
    _lazy_init()
    _C.synchronize()


# ---- RNG
def manual_seed(seed):
    _lazy_init()
    _C.manual_seed(current_device(), int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def manual_seed_all(seed):
    for d in range(device_count()):
        _C.manual_seed(d, int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def seed():
    return _C.seed(current_device())


def seed_all():
    s = seed()
    manual_seed_all(s)


def initial_seed():
    return _C.initial_seed(current_device())


def get_rng_state(device="tpu"):
    return torch.frombuffer(bytearray(_C.get_rng_state(_index(device))), dtype=torch.uint8)


def set_rng_state(new_state, device="tpu"):
    _C.set_rng_state(_index(device), bytes(new_state.cpu().to(torch.uint8).numpy().tobytes()))


def get_rng_state_all():
    return [get_rng_state(d) for d in range(device_count())]


def set_rng_state_all(states):
    for d, s in enumerate(states):
        set_rng_state(s, d)


def _is_in_bad_fork():
    return False


# ---- capabilities
def is_bf16_supported(including_emulation=True):
    return True


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def get_device_name(device=None):
    """Names the PJRT platform `tpu` runs on, e.g. 'PJRT cpu (cpu)' or 'PJRT cuda (NVIDIA H200)'."""
    _lazy_init()
    return f"PJRT {_C.platform_name()} ({_C.device_kind()})"


class _Properties:
    def __init__(self, idx):
        self.name = get_device_name(idx)
        self.platform = _C.platform_name()
        self.platform_version = _C.platform_version()
        self.index = idx
        self.total_memory = _total_memory(idx)

    def __repr__(self):
        return f"_TpuDeviceProperties(name='{self.name}', total_memory={self.total_memory})"


def _total_memory(idx):
    # the plugin's limit; the CPU plugin reports none: its buffers are host memory
    return _C.memory_info(idx)[1]


def mem_get_info(device=None):
    """(free, total) bytes of the device's memory, as torch.cuda.mem_get_info (the CPU plugin: the
    host's available and total memory)."""
    return _C.memory_info(_index(device))


def get_device_properties(device=None):
    return _Properties(_index(device))


# ---- streams and events: one in-order queue per device
class Stream:
    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def synchronize(self):
        synchronize()

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self._time = None

    def record(self, stream=None):
        import time

        if self.enable_timing:
            synchronize()
            self._time = time.perf_counter()

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        synchronize()

    def elapsed_time(self, end_event):
        if self._time is None or end_event._time is None:
            raise RuntimeError("Events must be created with enable_timing=True and recorded")
        return (end_event._time - self._time) * 1000.0


_streams = {}


def current_stream(device=None):
    idx = _index(device)
    return _streams.setdefault(idx, Stream(idx))


default_stream = current_stream


class StreamContext:
    """As torch.cuda.StreamContext: makes `stream` the current stream of its device inside the
    block and restores the previous one after; reusable (entered again on every use, as SGLang's
    scheduler does). `None` is a no-op. tpu has one in-order queue per device, so this changes
    what current_stream() returns, not the order work runs in."""

    def __init__(self, stream):
        self.stream = stream
        self._prev = []

    def __enter__(self):
        s = self.stream
        if s is None:
            return None
        idx = s.device.index or 0
        self._prev.append((idx, _streams.get(idx)))
        _streams[idx] = s
        return s

    def __exit__(self, *exc):
        if self.stream is None or not self._prev:
            return False
        idx, prev = self._prev.pop()
        if prev is None:
            _streams.pop(idx, None)
        else:
            _streams[idx] = prev
        return False


def stream(s):
    """A StreamContext for `s` (as torch.cuda.stream)."""
    return StreamContext(s)


# ---- memory
def empty_cache():
    pass  # buffers are freed as soon as their tensors die


def memory_allocated(device=None):
    return _C.memory_allocated()


def max_memory_allocated(device=None):
    return _C.max_memory_allocated()


def reset_peak_memory_stats(device=None):
    _C.reset_peak_memory_stats()
    _C.reset_peak_buffer_bytes()


def memory_reserved(device=None):
    """Bytes of device buffers that exist (tensors whose values are still deferred have none)."""
    return _C.buffer_bytes()


def max_memory_reserved(device=None):
    return _C.peak_buffer_bytes()


def memory_stats(device=None):
    """torch.cuda.memory_stats's keys that apply: allocated / active bytes (the tensors' storages;
    no caching allocator sits between them, so active equals allocated), reserved bytes (the
    device buffers that exist), and the plugin's own figures under ``device.``."""
    allocated, peak = _C.memory_allocated(), _C.max_memory_allocated()
    buffers, buffers_peak = _C.buffer_bytes(), _C.peak_buffer_bytes()
    stats = {
        "allocated_bytes.all.current": allocated,
        "allocated_bytes.all.peak": peak,
        "active_bytes.all.current": allocated,
        "active_bytes.all.peak": peak,
        "reserved_bytes.all.current": buffers,
        "reserved_bytes.all.peak": buffers_peak,
        # bytes of device buffers that exist (deferred or fused-away tensors have none)
        "buffer_bytes.all.current": buffers,
        "buffer_bytes.all.peak": buffers_peak,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }
    for k, v in _C.device_memory_stats(_index(device)).items():
        stats[f"device.{k}"] = v
    return stats


# ---- matmul precision
class Precision(enum.IntEnum):
    """Precision of float32 matmul-like ops on tpu (see docs/STATUS.md)."""

    DEFAULT = 0  # operands rounded to bf16, f32 accumulation (1 pass)
    HIGH = 1     # bf16x3 (3 passes)
    HIGHEST = 2  # bf16x6 (6 passes, float32-class accuracy)


_TLS_KEY = "torch_tpu.matmul_precision"


def _as_precision(p):
    """A Precision from the enum, its value, or its name in any case ("highest")."""
    if isinstance(p, str):
        try:
            return Precision[p.upper()]
        except KeyError:
            raise ValueError(f"unknown matmul precision {p!r}; expected one of "
                             f"{[m.name.lower() for m in Precision]}") from None
    return Precision(p)


def _thread_override():
    if torch._C._is_key_in_tls(_TLS_KEY):
        v = torch._C._get_obj_in_tls(_TLS_KEY)
        if v >= 0:
            return Precision(v)
    return None


def set_matmul_precision(p):
    """Sets the process-wide precision of float32 matmul-like ops on tpu
    (`with torch.tpu.precision(p)` overrides it for one thread). A later
    torch.set_float32_matmul_precision("medium"|"high"|"highest") (ATen's setting,
    which tpu reads) takes over with DEFAULT|HIGH|HIGHEST, until this is called again."""
    _C._set_precision(int(_as_precision(p)))


def get_matmul_precision():
    """The precision in effect on this thread."""
    o = _thread_override()
    return o if o is not None else Precision(_C._get_precision())


@contextlib.contextmanager
def precision(p):
    """Thread-local precision for float32 matmul-like ops on tpu; nests. Backward
    ops that autograd runs for work started inside it use it too."""
    prev = torch._C._get_obj_in_tls(_TLS_KEY) if torch._C._is_key_in_tls(_TLS_KEY) else -1
    torch._C._stash_obj_in_tls(_TLS_KEY, int(_as_precision(p)))
    try:
        yield
    finally:
        torch._C._stash_obj_in_tls(_TLS_KEY, prev)
