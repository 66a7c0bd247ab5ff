"""Counters of the tpu runtime: compiles, compile-cache hits and misses,
executions, host transfers and their bytes, and the ops that ran on the CPU
fallback (op name -> calls)."""
from . import _C

__all__ = ["report", "reset", "cpu_fallbacks"]


def report():
    """A dict of every counter (a snapshot). Compiled mode adds compiled_graphs (FX
    graphs given to the backend), compiled_eager_nodes (nodes that ran eagerly between
    programs), compiled_eager_graphs (graphs that could not be captured at all),
    compiled_call_seconds (time spent in compiled graphs' calls on the Python side,
    program dispatch included) next to captures and compiled_runs."""
    from . import _compile

    m = _C.metrics()
    for k, v in _compile.stats().items():
        m["compiled_" + k] = v
    return m


def reset():
    from . import _compile

    _C.reset_metrics()
    _compile.reset_stats()


def cpu_fallbacks():
    return dict(_C.metrics()["cpu_fallbacks"])


def __getattr__(name):
    m = report()
    if name in m:
        return m[name]
    raise AttributeError(name)
