"""tpu kernels for the FBGEMM ops TorchRec's KeyedJaggedTensor calls (fbgemm_gpu's
`torch.ops.fbgemm`), as compositions of lowered ops, so a KJT on tpu stays on tpu:

- `asynchronous_complete_cumsum` / `_exclusive_cumsum` / `_inclusive_cumsum`: lengths -> offsets;
- `permute_1D_sparse_data` / `permute_2D_sparse_data`: reorder the jagged segments of `values`
  (and `weights`) by a permutation of the segments (`KeyedJaggedTensor.permute`);
- `permute_pooled_embs`: reorder the column blocks of pooled embeddings (`KeyedTensor.regroup`;
  fbgemm's autograd kernel of `permute_pooled_embs_auto_grad` calls it forward and backward).

They are registered for PrivateUse1 when torch_tpu loads, before fbgemm_gpu defines the ops (the
dispatcher keeps an implementation until its schema arrives), so nothing depends on import order;
without fbgemm_gpu they are never reached. Like fbgemm's CPU and CUDA kernels, a permute whose
`permuted_lengths_sum` is not given reads the total length from the device (one sync).
"""
import torch


def _cumsum(t):
    return torch.cumsum(t, dim=-1).to(t.dtype)


def asynchronous_inclusive_cumsum(t_in):
    return _cumsum(t_in)


def asynchronous_exclusive_cumsum(t_in):
    return _cumsum(t_in) - t_in


def asynchronous_complete_cumsum(t_in):
    if t_in.dim() not in (1, 2):
        raise RuntimeError(f"asynchronous_complete_cumsum: expected a 1-D or 2-D tensor, got {t_in.dim()}-D")
    zero = t_in.new_zeros(t_in.shape[:-1] + (1,))
    return torch.cat([zero, _cumsum(t_in)], dim=-1)


def _permute_segments(permute, lengths, values, weights, permuted_lengths_sum):
    """lengths is (segment groups, segments per group); group permute[i] of the input becomes
    group i of the output, its segments in order."""
    groups, per_group = lengths.shape
    permuted_lengths = lengths.index_select(0, permute)
    in_offsets = asynchronous_complete_cumsum(lengths.reshape(-1))
    out_lengths = permuted_lengths.reshape(-1)
    out_offsets = asynchronous_complete_cumsum(out_lengths)
    total = int(permuted_lengths_sum) if permuted_lengths_sum is not None else int(out_lengths.sum().item())
    index_dtype = in_offsets.dtype
    position = torch.arange(total, device=values.device, dtype=index_dtype)
    # the output segment of each position (zero-length segments are skipped by right=True)
    segment = torch.searchsorted(out_offsets[1:], position, right=True)
    source_segment = (permute.to(index_dtype).unsqueeze(1) * per_group
                      + torch.arange(per_group, device=values.device, dtype=index_dtype)).reshape(-1)
    source_start = in_offsets.index_select(0, source_segment)
    source = source_start.index_select(0, segment) + (position - out_offsets.index_select(0, segment))
    permuted_values = values.index_select(0, source)
    permuted_weights = weights.index_select(0, source) if weights is not None else None
    return permuted_lengths, permuted_values, permuted_weights


def _check_permute(name, permute, lengths, dims):
    if lengths.dim() != dims:
        raise RuntimeError(f"{name}: expected {dims}-D lengths, got {lengths.dim()}-D")
    if permute.dim() != 1:
        raise RuntimeError(f"{name}: expected a 1-D permute, got {permute.dim()}-D")


def permute_2D_sparse_data(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    _check_permute("permute_2D_sparse_data", permute, lengths, 2)
    return _permute_segments(permute, lengths, values, weights, permuted_lengths_sum)


def permute_1D_sparse_data(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    _check_permute("permute_1D_sparse_data", permute, lengths, 1)
    permuted_lengths, permuted_values, permuted_weights = _permute_segments(
        permute, lengths.unsqueeze(1), values, weights, permuted_lengths_sum)
    return permuted_lengths.reshape(-1), permuted_values, permuted_weights


def block_permutation_columns(offset_dim_list, permute_list, width):
    """Column j of a block-permuted matrix (output block i = input block permute_list[i], input
    blocks at the column offsets offset_dim_list) reads input column result[j]."""
    permute = permute_list.long()
    widths = (offset_dim_list[1:] - offset_dim_list[:-1]).index_select(0, permute)
    out_offsets = asynchronous_complete_cumsum(widths)
    column = torch.arange(width, device=offset_dim_list.device, dtype=out_offsets.dtype)
    block = torch.searchsorted(out_offsets[1:], column, right=True)
    start = offset_dim_list.index_select(0, permute).to(out_offsets.dtype)
    return (start.index_select(0, block) + column - out_offsets.index_select(0, block)).long()


def permute_pooled_embs(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list):
    if pooled_embs.dim() != 2:
        raise RuntimeError(f"permute_pooled_embs: expected 2-D pooled_embs, got {pooled_embs.dim()}-D")
    return pooled_embs.index_select(1, block_permutation_columns(offset_dim_list, permute_list, pooled_embs.size(1)))


KERNELS = [(f.__name__, f) for f in (asynchronous_complete_cumsum, asynchronous_exclusive_cumsum,
                                     asynchronous_inclusive_cumsum, permute_1D_sparse_data, permute_2D_sparse_data,
                                     permute_pooled_embs)]
