"""Bounded dynamism: programs that serve a range of sizes.

A dim whose size keeps changing (a sequence that grows by one token per step, prompts of
other lengths, the last batch of an epoch) is *dynamic*: its tensor's storage is padded
to a bucket (the bound), programs are built at the bound and take the real size as a
run-time parameter, so a new size within the bucket compiles nothing. XLA masks what the
padding would change (reductions, softmax, contractions, sorts, cumulative ops).

It is on by default. A size becomes dynamic when it changes between epochs (an epoch
ends at each host read or ``torch.tpu.synchronize()``): the second sequence length a
training loop sees, the second token of ``generate()``. Results of ops on dynamic
tensors are dynamic in the dims that follow the dynamic size.

- ``mark_dynamic(t, dim, max=None)``: make dim ``dim`` of ``t`` dynamic now, with bound
  ``max`` (default: the bucket ladder's step for its size).
- ``mark_static(t)``: the size policy never makes ``t`` dynamic.
- ``set_buckets(steps, growth=1.25, align=128)``: the bucket ladder (also
  ``TORCH_TPU_BUCKETS=16,32,64,...``); sizes past the last step grow by ``growth``,
  rounded up to a multiple of ``align``.
- ``TORCH_TPU_DYNAMIC=0``: never make a size dynamic (``mark_dynamic`` still works).
"""
import os as _os

import torch

from . import _C

__all__ = ["mark_dynamic", "mark_static", "get_dynamism_info", "set_buckets", "buckets", "bucket"]



def mark_dynamic(t, dim, max=None):
    """Makes dim ``dim`` of tpu tensor ``t`` dynamic, bounded by ``max`` (default: its
    bucket). Every view of ``t``'s storage sees it. Returns ``t``."""
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
        raise TypeError(f"mark_dynamic: expected a tpu tensor, got {type(t).__name__}"
                        f"{'' if not isinstance(t, torch.Tensor) else ' on ' + str(t.device)}")
    dim = dim + t.dim() if dim < 0 else dim
    if not 0 <= dim < t.dim():
        raise IndexError(f"Dimension out of range (expected to be in range of [{-t.dim()}, {t.dim() - 1}], but got {dim})")
    n = t.size(dim)
    bound = _C._bucket(n) if max is None else int(max)
    if bound < n:
        raise ValueError(f"mark_dynamic: max={bound} is below the size {n} of dim {dim}")
    if n >= 2:  # sizes 0 and 1 stay static (broadcasting treats 1 specially)
        _C._mark_dynamic(t, dim, bound)
    return t


def mark_static(t):
    """Keeps ``t``'s storage static: the size policy never pads it. Returns ``t``."""
    _C._mark_static(t)
    return t


def get_dynamism_info(t):
    """A list of (dim, size, bound) for the dynamic dims of ``t``."""
    sizes, _ = _C._dynamic_sizes(t)
    bounds = dict(sizes)
    return [(d, s, bounds[s]) for d, s in enumerate(t.shape) if s in bounds and s >= 2]


def set_buckets(steps, growth=1.25, align=128):
    steps = sorted(int(s) for s in steps)
    if not steps or steps[0] < 1 or growth <= 1 or align < 1:
        raise ValueError("set_buckets: steps must be positive, growth > 1, align >= 1")
    _C._set_buckets(steps, float(growth), int(align))


def buckets():
    """The ladder's explicit steps."""
    return list(_C._bucket_steps())


def bucket(n):
    """The bound a dynamic size ``n`` is built at."""
    return _C._bucket(int(n))


def _configure():
    if _os.environ.get("TORCH_TPU_DYNAMIC", "1") == "0":
        _C._set_dynamism(False)
    spec = _os.environ.get("TORCH_TPU_BUCKETS")
    if spec:
        parts = spec.replace(";", ":").split(":")
        steps = [int(x) for x in parts[0].split(",") if x.strip()]
        growth = float(parts[1]) if len(parts) > 1 and parts[1] else 1.25
        align = int(parts[2]) if len(parts) > 2 and parts[2] else 128
        set_buckets(steps, growth, align)
