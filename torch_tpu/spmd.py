"""In-program collectives (the v2 path of torch.distributed on tpu).

`replicate(fn, num_replicas)` captures `fn` once (on tpu:0, through the same kernels
and lowering rules as eager) and builds ONE StableHLO program for `num_replicas`
replicas on devices tpu:0..N-1 of this process. PyTorch's functional collectives
called inside `fn` (`torch.distributed._functional_collectives.all_reduce`,
`all_gather_tensor`, `reduce_scatter_tensor`, `all_to_all_single`, `wait_tensor`, or
`torch.ops._c10d_functional.*` directly) become `stablehlo.all_reduce`,
`all_gather`, `reduce_scatter` and `all_to_all` with replica groups, so the data
never leaves the program: the path that TPU ICI and GPU NCCL (inside XLA) take.
On the XLA CPU plugin it runs with TORCH_TPU_NUM_DEVICES=N in one process.

    prog = torch_tpu.spmd.replicate(step, num_replicas=2)
    outs = prog([(x0, w0), (x1, w1)])   # replica r's arguments on tpu:r -> per-replica outputs

Groups: a collective's group names its replicas. By default every collective spans
all replicas (rank r of the group is replica r); `groups={name: [[0, 1], [2, 3]]}`
(or a list of lists for every group) gives explicit replica groups.

Limits: static shapes (a new argument shape needs a new `replicate`), equal splits in
all_to_all_single, ops that need host values (`.item()`) are not allowed inside `fn`,
device-side index checks are off inside the program, and random ops draw the same
numbers on every replica.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import _C

__all__ = ["replicate", "ReplicatedFunction"]


def _group_size(group_name):
    """Ranks in the process group named `group_name`, or None when there is no such group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        return len(dist.get_process_group_ranks(dist.distributed_c10d._resolve_process_group(group_name)))
    except Exception:
        return None


def _unwrap(t):
    # funcol wraps results in AsyncCollectiveTensor; inside a program there is nothing to wait for
    elem = getattr(t, "elem", None)
    return elem if isinstance(elem, torch.Tensor) else t


class _InProgramCollectives(TorchDispatchMode):
    """Turns _c10d_functional ops into StableHLO collectives of the capture."""

    def __init__(self, replicas, groups):
        super().__init__()
        self.replicas = replicas
        self.groups = groups

    def groups_of(self, group_name):
        g = self.groups
        if isinstance(g, dict):
            g = g.get(group_name)
        if g is not None:
            return [list(map(int, grp)) for grp in g]
        size = _group_size(group_name)
        if size is not None and size != self.replicas:
            raise ValueError(
                f"torch_tpu.spmd: group {group_name!r} has {size} ranks but the program has {self.replicas} "
                "replicas; pass groups={name: [[replicas of group 0], [replicas of group 1], ...]}")
        return [list(range(self.replicas))]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "namespace", None) != "_c10d_functional":
            return func(*args, **kwargs)
        name = func._opname
        a = [_unwrap(x) for x in args]
        if name in ("wait_tensor", "_wrap_tensor_autograd"):  # nothing to wait for inside a program
            return a[0]
        if name in ("all_reduce", "all_reduce_"):
            x, op, group = a[0], a[1], a[2]
            out = _C._spmd_all_reduce(x, op, self.groups_of(group))
            if name == "all_reduce_":
                x.copy_(out)
                return x
            return out
        if name == "all_gather_into_tensor":
            x, size, group = a
            return _C._spmd_all_gather(x, int(size), self.groups_of(group))
        if name == "reduce_scatter_tensor":
            x, op, size, group = a
            return _C._spmd_reduce_scatter(x, op, int(size), self.groups_of(group))
        if name == "all_to_all_single":
            x, out_splits, in_splits, group = a
            return _C._spmd_all_to_all(x, [int(s) for s in out_splits], [int(s) for s in in_splits],
                                       self.groups_of(group))
        raise NotImplementedError(f"torch_tpu.spmd: _c10d_functional.{name} has no in-program lowering")


class ReplicatedFunction:
    """A function captured into one program for several replicas (see `replicate`)."""

    def __init__(self, fn, num_replicas, groups=None):
        if num_replicas < 1 or num_replicas > torch.tpu.device_count():
            raise ValueError(f"torch_tpu.spmd: {num_replicas} replicas need as many tpu devices "
                             f"(TORCH_TPU_NUM_DEVICES); this process has {torch.tpu.device_count()}")
        self.fn, self.replicas, self.groups = fn, num_replicas, groups
        self.program = None
        self._key = None
        self._out_spec = None

    def _capture(self, example):
        standins = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="tpu:0") for t in example]
        _C._spmd_begin(0)
        try:
            for k, s in enumerate(standins):
                _C._spmd_input(s, k)
            with _InProgramCollectives(self.replicas, self.groups):
                result = self.fn(*standins)
            flat, spec = tree_flatten(result)
            flat = [_unwrap(t) for t in flat]
            if not all(isinstance(t, torch.Tensor) for t in flat):
                raise TypeError("torch_tpu.spmd: the function must return tensors (or nested tuples/lists of them)")
            self.program = _C._spmd_end(standins, flat, self.replicas)
        except BaseException:
            _C._spmd_abort()
            raise
        self._out_spec = spec

    def __call__(self, per_replica_args):
        per_replica_args = [list(a) for a in per_replica_args]
        if len(per_replica_args) != self.replicas:
            raise ValueError(f"torch_tpu.spmd: expected arguments for {self.replicas} replicas, got {len(per_replica_args)}")
        # the program takes each argument in one layout: contiguous, on its replica's device
        staged = [[t if t.is_contiguous() and t.storage_offset() == 0
                   and t.untyped_storage().nbytes() == t.numel() * t.element_size()
                   else t.contiguous().clone() for t in args] for args in per_replica_args]
        key = tuple((tuple(t.shape), t.dtype) for t in staged[0])
        if self.program is None or key != self._key:
            self._capture(staged[0])
            self._key = key
        outs = self.program.run(staged)
        return [tree_unflatten(list(o), self._out_spec) for o in outs]

    @property
    def text(self):
        """The StableHLO text of the replicated program (after the first call)."""
        return self.program.text if self.program is not None else None


def replicate(fn, num_replicas=None, groups=None):
    """`fn` as one program run by `num_replicas` replicas (default: every tpu device)."""
    return ReplicatedFunction(fn, num_replicas or torch.tpu.device_count(), groups)
