"""tpu kernels for the FBGEMM ops TorchRec's KeyedJaggedTensor calls (fbgemm_gpu's
`torch.ops.fbgemm`), as compositions of lowered ops, so a KJT on tpu stays on tpu:

- `asynchronous_complete_cumsum` / `_exclusive_cumsum` / `_inclusive_cumsum`: lengths -> offsets;
- `permute_1D_sparse_data` / `permute_2D_sparse_data`: reorder the jagged segments of `values`
  (and `weights`) by a permutation of the segments (`KeyedJaggedTensor.permute`);
- `permute_pooled_embs`: reorder the column blocks of pooled embeddings (`KeyedTensor.regroup`;
  fbgemm's autograd kernel of `permute_pooled_embs_auto_grad` calls it forward and backward);
- `block_bucketize_sparse_features`: split each feature's ids into row blocks, one per rank (the
  input distribution of row-wise sharding). Its variable-batch and uneven-block options run
  fbgemm's CPU kernel on host copies.

They are registered for PrivateUse1 when torch_tpu loads, before fbgemm_gpu defines the ops (the
dispatcher keeps an implementation until its schema arrives), so nothing depends on import order;
without fbgemm_gpu they are never reached. Like fbgemm's CPU and CUDA kernels, a permute whose
`permuted_lengths_sum` is not given reads the total length from the device (one sync).
"""
import torch

from ._jagged import segments


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
    position, segment, _ = segments(out_offsets, total)  # the output segment of each position
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
    column, block, _ = segments(out_offsets, width)
    start = offset_dim_list.index_select(0, permute).to(out_offsets.dtype)
    return (start.index_select(0, block) + column - out_offsets.index_select(0, block)).long()


def permute_pooled_embs(pooled_embs, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list):
    if pooled_embs.dim() != 2:
        raise RuntimeError(f"permute_pooled_embs: expected 2-D pooled_embs, got {pooled_embs.dim()}-D")
    return pooled_embs.index_select(1, block_permutation_columns(offset_dim_list, permute_list, pooled_embs.size(1)))


def _bucketize_on_host(*args, **kwargs):
    device = args[0].device

    def move(x, to):
        if isinstance(x, torch.Tensor):
            return x.to(to)
        if isinstance(x, (list, tuple)):
            return type(x)(move(y, to) for y in x)
        return x

    return move(torch.ops.fbgemm.block_bucketize_sparse_features(*move(args, "cpu"), **move(kwargs, "cpu")), device)


def block_bucketize_sparse_features(lengths, indices, bucketize_pos, sequence, block_sizes, my_size, weights=None,
                                    batch_size_per_feature=None, max_B=-1, block_bucketize_pos=None,
                                    keep_orig_idx=False, total_num_blocks=None, keep_orig_idx_per_feature=None):
    """Ids of feature t below block_sizes[t] * my_size go to bucket id // block_sizes[t] as
    id % block_sizes[t]; larger ids to bucket id % my_size as id // my_size. The output segments
    are ordered (bucket, feature, sample), ids keeping their order within a segment."""
    if (batch_size_per_feature is not None or block_bucketize_pos is not None or total_num_blocks is not None
            or keep_orig_idx_per_feature is not None):
        return _bucketize_on_host(lengths, indices, bucketize_pos, sequence, block_sizes, my_size, weights,
                                  batch_size_per_feature, max_B, block_bucketize_pos, keep_orig_idx,
                                  total_num_blocks, keep_orig_idx_per_feature)
    total_segments = lengths.numel()
    features = block_sizes.numel()
    index_dtype = indices.dtype
    offsets = asynchronous_complete_cumsum(lengths.reshape(-1).to(torch.int64))
    position, segment, _ = segments(offsets, indices.numel())
    batch = total_segments // max(features, 1)
    block = block_sizes.to(index_dtype).index_select(0, torch.div(segment, max(batch, 1), rounding_mode="floor"))
    block = torch.where(block > 0, block, torch.ones_like(block))
    in_blocks = indices < block * my_size
    bucket = torch.where(in_blocks, torch.div(indices, block, rounding_mode="floor"), torch.remainder(indices, my_size))
    new_ids = indices if keep_orig_idx else torch.where(
        in_blocks, torch.remainder(indices, block), torch.div(indices, my_size, rounding_mode="floor"))
    key = bucket.to(torch.int64) * total_segments + segment
    _, order = torch.sort(key, stable=True)
    new_lengths = torch.zeros(my_size * total_segments, dtype=lengths.dtype, device=lengths.device).index_add(
        0, key, torch.ones_like(key, dtype=lengths.dtype))
    new_weights = weights.index_select(0, order) if weights is not None else None
    new_pos = (position - offsets.index_select(0, segment)).to(index_dtype).index_select(0, order) \
        if bucketize_pos else None
    unbucketize_permute = torch.empty_like(order).scatter(0, order, position).to(index_dtype) if sequence else None
    return new_lengths, new_ids.index_select(0, order), new_weights, new_pos, unbucketize_permute


KERNELS = [(f.__name__, f) for f in (asynchronous_complete_cumsum, asynchronous_exclusive_cumsum,
                                     asynchronous_inclusive_cumsum, permute_1D_sparse_data, permute_2D_sparse_data,
                                     permute_pooled_embs, block_bucketize_sparse_features)]
