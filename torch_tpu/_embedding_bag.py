"""`nn.EmbeddingBag` / `F.embedding_bag` on tpu: `aten::_embedding_bag` and
`_embedding_bag_forward_only` as a static-shape composition of ops tpu lowers, for the
sum, mean and max modes with offsets (1-D input) or fixed-size bags (2-D input),
`per_sample_weights`, `padding_idx`, `include_last_offset` and `scale_grad_by_freq`.

PyTorch's CPU and CUDA kernels loop over bags; on tpu each index is given its bag on
the device (`searchsorted` of its position in the offsets), the rows are gathered
(`index_select`) and reduced per bag (`index_add` for sum and mean, `scatter_reduce`
amax for max). The kernel sits at the AutogradPrivateUse1 key (the key a backend owns),
so autograd differentiates the composition and there is no separate backward: the
gradient reaches the weight through the gather and `per_sample_weights` through the
product, as ATen's backward kernels compute it. Sums of float16/bfloat16 rows are
accumulated in float32 and rounded once, as CUDA's kernel accumulates.

Differences from CPU that stay: `sparse=True` gradients are not supported (tpu has no
sparse tensors) and raise; offsets are data on the device, so CPU's host-side checks of
their values (`offsets[0] == 0`, increasing) are not made; among equal maxima the
gradient of max mode is shared (CPU gives it to one row).
"""
import torch

_SUM, _MEAN, _MAX = 0, 1, 2


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by `scale` (scale_grad_by_freq)."""

    @staticmethod
    def forward(ctx, rows, scale):
        ctx.save_for_backward(scale)
        return rows.view_as(rows)

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        return grad * scale.unsqueeze(1).to(grad.dtype), None


def _check(weight, indices, offsets, mode, per_sample_weights, include_last_offset):
    torch._check(indices.dtype in (torch.int64, torch.int32),
                 lambda: f"expected indices to be long or int, got {indices.dtype}")
    torch._check(offsets.dtype in (torch.int64, torch.int32),
                 lambda: f"expected offsets to be long or int, got {offsets.dtype}")
    torch._check(weight.dtype.is_floating_point, lambda: f"expected weight to be floating point type, got {weight.dtype}")
    torch._check(weight.dim() == 2, lambda: f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.dim()}")
    torch._check(indices.dim() in (1, 2), lambda: f"input has to be 1D or 2D Tensor, but got Tensor of dimension {indices.dim()}")
    if indices.dim() == 1:
        torch._check(offsets.dim() == 1, lambda: f"offsets has to be a 1D Tensor, but got Tensor of dimension {offsets.dim()}")
    if include_last_offset:
        torch._check(offsets.numel() >= 1, lambda: "include_last_offset: numBags should be at least 1")
    if per_sample_weights is not None:
        torch._check(mode == _SUM, lambda: "embedding_bag: per_sample_weights only supported with mode='sum'")
        torch._check(per_sample_weights.dim() == 1,
                     lambda: f"expected per_sample_weights to be 1D tensor, got {per_sample_weights.dim()}D")
        torch._check(per_sample_weights.numel() == indices.numel(),
                     lambda: (f"expected per_sample_weights.numel() ({per_sample_weights.numel()} to be the same as "
                              f"indices.numel() ({indices.numel()})"))


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    _check(weight, indices, offsets, mode, per_sample_weights, include_last_offset)
    if sparse and weight.requires_grad:
        raise NotImplementedError("embedding_bag with sparse=True: sparse gradients are not supported on tpu; "
                                  "use sparse=False (the weight's gradient is then dense)")
    device = weight.device
    if indices.dim() == 2:  # fixed-size bags, one per row
        bags, per_bag = indices.shape
        offsets = torch.arange(0, bags * per_bag, per_bag, device=device, dtype=indices.dtype) if per_bag else \
            torch.zeros(bags, device=device, dtype=indices.dtype)
        include_last_offset = False
    indices = indices.reshape(-1)
    starts = offsets[:-1] if include_last_offset else offsets
    num_bags, n, dim = starts.numel(), indices.numel(), weight.size(1)
    index_dtype = indices.dtype

    position = torch.arange(n, device=device, dtype=starts.dtype)
    bag = torch.searchsorted(starts, position, right=True) - 1  # the bag of each index
    valid = (bag >= 0) & (bag < num_bags)
    if include_last_offset:
        valid = valid & (position < offsets[-1])
    if padding_idx >= 0:
        valid = valid & (indices != padding_idx)
    bag_c = bag.clamp(0, max(num_bags - 1, 0))
    row_ids = torch.where(valid, indices, torch.zeros_like(indices))

    acc = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    rows = weight.index_select(0, row_ids)
    if scale_grad_by_freq and weight.requires_grad:
        freq = torch.zeros(weight.size(0), device=device, dtype=acc).index_add(0, row_ids, valid.to(acc))
        rows = _ScaleGrad.apply(rows, 1.0 / freq.index_select(0, row_ids).clamp(min=1))
    rows = rows.to(acc)
    counts = torch.zeros(num_bags, device=device, dtype=acc).index_add(0, bag_c, valid.to(acc))
    keep = valid.unsqueeze(1)

    if mode == _MAX:
        vals = torch.where(keep, rows, torch.full_like(rows, float("-inf")))
        spread = bag_c.unsqueeze(1).expand(n, dim)
        out = torch.full((num_bags, dim), float("-inf"), device=device, dtype=acc)
        out = out.scatter_reduce(0, spread, vals, "amax", include_self=True)
        out = torch.where(counts.unsqueeze(1) > 0, out, torch.zeros_like(out))
        hit = keep & (vals == out.index_select(0, bag_c))
        big = torch.iinfo(index_dtype).max
        cand = torch.where(hit, indices.unsqueeze(1).expand(n, dim), torch.full((n, dim), big, device=device,
                                                                                  dtype=index_dtype))
        first = torch.full((num_bags, dim), big, device=device, dtype=index_dtype).scatter_reduce(0, spread, cand,
                                                                                                   "amin")
        max_indices = torch.where(first == big, torch.full_like(first, -1), first)
    else:
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.to(acc).unsqueeze(1)
        rows = torch.where(keep, rows, torch.zeros_like(rows))
        out = torch.zeros((num_bags, dim), device=device, dtype=acc).index_add(0, bag_c, rows)
        if mode == _MEAN:
            out = out / counts.clamp(min=1).unsqueeze(1)
        max_indices = indices.new_empty(0)
    bag_size = counts.to(index_dtype)
    if include_last_offset:
        bag_size = torch.cat([bag_size, bag_size.new_zeros(1)])
    return out.to(weight.dtype), bag.to(index_dtype), bag_size, max_indices


# (op, kernel, dispatch key): registered by torch_tpu at start-up
KERNELS = [
    ("_embedding_bag", _embedding_bag, "AutogradPrivateUse1"),
    ("_embedding_bag_forward_only", _embedding_bag, "AutogradPrivateUse1"),
]
