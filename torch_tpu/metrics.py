"""Counters of the tpu runtime: compiles, compile-cache hits and misses,
executions, host transfers and their bytes, and the ops that ran on the CPU
fallback (op name -> calls)."""
from . import _C

__all__ = ["report", "reset", "cpu_fallbacks"]


def report():
    """A dict of every counter (a snapshot)."""
    return _C.metrics()


def reset():
    _C.reset_metrics()


def cpu_fallbacks():
    return dict(_C.metrics()["cpu_fallbacks"])


def __getattr__(name):
    m = _C.metrics()
    if name in m:
        return m[name]
    raise AttributeError(name)
