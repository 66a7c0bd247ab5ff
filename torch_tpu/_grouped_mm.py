"""`torch._grouped_mm` (`F.grouped_mm`) on tpu, for every floating dtype, in eager,
DeferAndFuse and compiled mode.

HuggingFace transformers sends the experts of its mixture-of-experts models (Mixtral,
Qwen-MoE, DeepSeek, OLMoE, ...) to `grouped_mm` whenever the weights are on a `tpu`
device, whatever their dtype. PyTorch's own kernels do not fit a PJRT device: the
CompositeExplicitAutograd kernel reads the offsets on the host and runs one matmul per
group (a host sync and a data-dependent slice per group), and the Meta kernel, which
`torch.compile` uses for shapes, accepts bfloat16 only (CUDA's limit).

This module gives the op a tpu kernel at the AutogradPrivateUse1 key (the key a backend
owns; it runs before the Meta kernel is consulted, for real and fake tpu tensors alike)
that is a static-shape composition of ops tpu lowers: each row (or contraction slice) is
assigned its group by comparing its index with `offs` on the device, and one batched
matmul over all groups, masked to each group's rows, gives the result. Autograd
differentiates the composition, so there is no separate backward. It does G times the
arithmetic of a true ragged matmul (G = number of groups): right for the small expert
counts of tests and tiny models, wasteful for 64+ experts (a ragged-dot lowering is the
known next step, docs/STATUS.md). Rows past the last offset are zero (CUDA leaves them
undefined).
"""
import torch

from ._names import dtype_name

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check(a, b, offs, bias, out_dtype):
    torch._check(bias is None, lambda: "Bias not supported yet")
    torch._check(a.dim() in (2, 3) and b.dim() in (2, 3),
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={a.dim()} and mat_b.dim()={b.dim()}")
    torch._check(a.dtype in _FLOATS,
                 lambda: f"Expected mat_a to be Float32, BFloat16 or Float16 matrix, got {dtype_name(a.dtype)}")
    torch._check(b.dtype in _FLOATS,
                 lambda: f"Expected mat_b to be Float32, BFloat16 or Float16 matrix, got {dtype_name(b.dtype)}")
    torch._check(a.dtype == b.dtype, lambda: f"Expected mat_a and mat_b to have the same dtype, got {a.dtype} and {b.dtype}")
    torch._check(a.size(-1) == b.size(-2), lambda: "contraction dimension of mat_a and mat_b must match")
    torch._check((offs is not None) == (a.dim() == 2 or b.dim() == 2),
                 lambda: "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    if offs is not None:
        torch._check(offs.dim() == 1, lambda: "offsets have to be 1-D")
        torch._check(offs.dtype == torch.int32, lambda: "Offsets have to be int32")
    if a.dim() == 2 and b.dim() == 3:
        torch._check(offs.size(0) == b.size(0), lambda: "matrix batch sizes have to match")
    if a.dim() == 3 and b.dim() == 2:
        torch._check(offs.size(0) == a.size(0), lambda: "matrix batch sizes have to match")
    if a.dim() == 3 and b.dim() == 3:
        torch._check(a.size(0) == b.size(0), lambda: "batched dimension has to match")
    torch._check(out_dtype is None or out_dtype == a.dtype,
                 lambda: "out_dtype must be the same as input dtype if provided")


def _group_masks(offs, n):
    """(G, n) booleans: index i belongs to group g when offs[g-1] <= i < offs[g]."""
    idx = torch.arange(n, device=offs.device, dtype=torch.int32)
    ends = offs.unsqueeze(1)
    starts = torch.cat([offs.new_zeros(1), offs[:-1]]).unsqueeze(1)
    return (idx.unsqueeze(0) >= starts) & (idx.unsqueeze(0) < ends)


def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    _check(a, b, offs, bias, out_dtype)
    if a.dim() == 3 and b.dim() == 3:  # a plain batched matmul
        return torch.bmm(a, b)
    if a.dim() == 2 and b.dim() == 3:  # rows of a in groups, one (K, N) matrix per group
        m = _group_masks(offs, a.size(0)).to(a.dtype)  # (G, S)
        out = torch.bmm(a.unsqueeze(0) * m.unsqueeze(-1), b)  # (G, S, N), zero outside each group
        return out.sum(0)
    if a.dim() == 3 and b.dim() == 2:  # columns of b in groups, one (M, K) matrix per group
        m = _group_masks(offs, b.size(1)).to(b.dtype)  # (G, N)
        out = torch.bmm(a, b.unsqueeze(0) * m.unsqueeze(1))  # (G, M, N)
        return out.sum(0)
    # 2d x 2d: the contraction dimension in groups, one output matrix per group
    m = _group_masks(offs, a.size(1)).to(a.dtype)  # (G, K)
    return torch.matmul(a.unsqueeze(0) * m.unsqueeze(1), b)  # (G, M, N)


# (op, kernel, dispatch key), registered by torch_tpu at start-up
KERNELS = [("_grouped_mm", _grouped_mm, "AutogradPrivateUse1")]
