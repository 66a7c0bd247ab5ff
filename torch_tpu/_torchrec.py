"""tpu kernels for the `torchrec::` lookup ops of TorchRec's `UNFUSED_TPU` compute kernel
(`BatchedTPUEmbedding(Bag)`, what `DistributedModelParallel` shards tables onto for device
"tpu"). TorchRec defines the ops (torchrec/experimental/torch_tpu/pallas/ops.py) with CPU
kernels and autograd formulas that call the `*_backward` ops; these are their tpu kernels, as
compositions of lowered gathers and scatter-adds, registered for PrivateUse1 when torch_tpu
loads (TorchRec defines the schemas later, on import).

Semantics, per the schemas: `indices` address rows of `weights`; a bag is a run of indices given
by `offsets` (bags + 1 entries, the last one the number of indices used) or a fixed `pool`;
`row_offsets[b]` is added to the indices of bag b (tables stacked in one weight).
"""
import torch

from ._fbgemm import block_permutation_columns
from ._jagged import segments


def _rows(weights, indices):
    return weights.index_select(0, indices.reshape(-1).long())


def embedding_lookup(indices, weights, emb_dim):
    return _rows(weights, indices).reshape(*indices.shape, weights.size(1))


def embedding_lookup_backward(grad_out, indices, num_rows, emb_dim):
    grad = grad_out.new_zeros((num_rows, emb_dim))
    return grad.index_add(0, indices.reshape(-1).long(), grad_out.reshape(-1, emb_dim))


def embedding_pooled_lookup(idx, table, pool):
    return _rows(table, idx).reshape(-1, pool, table.size(1)).sum(dim=1)


def embedding_pooled_lookup_backward(grad_out, idx, pool, num_rows, emb_dim):
    per_index = grad_out.unsqueeze(1).expand(-1, pool, -1).reshape(-1, emb_dim)
    return grad_out.new_zeros((num_rows, emb_dim)).index_add(0, idx.reshape(-1).long(), per_index)


def _bags(indices, offsets, row_offsets=None):
    """(bag of each index, its row in weights, whether a bag covers it): the indices past
    offsets[-1] (TorchRec pads the batched ids) read row 0 and are masked out."""
    indices = indices.reshape(-1).long()
    _, bag, covered = segments(offsets, indices.numel())
    rows = indices if row_offsets is None else indices + row_offsets.long().index_select(0, bag)
    return bag, torch.where(covered, rows, torch.zeros_like(rows)), covered.unsqueeze(1)


def embedding_pooled_lookup_offset(indices, offsets, weights, emb_dim, row_offsets=None):
    bag, rows, covered = _bags(indices, offsets, row_offsets)
    pooled = weights.index_select(0, rows) * covered
    return weights.new_zeros((offsets.numel() - 1, emb_dim)).index_add(0, bag, pooled)


def embedding_pooled_lookup_offset_backward(grad_out, indices, offsets, num_rows, emb_dim, row_offsets=None):
    bag, rows, covered = _bags(indices, offsets, row_offsets)
    per_index = grad_out.index_select(0, bag) * covered
    return grad_out.new_zeros((num_rows, emb_dim)).index_add(0, rows, per_index)


def embedding_pooled_batched_lookup_offset(indices, offsets, weights, row_offsets, emb_dim):
    return embedding_pooled_lookup_offset(indices, offsets, weights, emb_dim, row_offsets)


def embedding_pooled_batched_lookup_offset_backward(grad_out, indices, offsets, row_offsets, num_rows, emb_dim):
    return embedding_pooled_lookup_offset_backward(grad_out, indices, offsets, num_rows, emb_dim, row_offsets)


def permute_pooled_embs(pooled_embs, offset_dim_list, permute_list):
    return pooled_embs.index_select(1, block_permutation_columns(offset_dim_list, permute_list, pooled_embs.size(1)))


def permute_pooled_embs_backward(grad_out, offset_dim_list, permute_list):
    source = block_permutation_columns(offset_dim_list, permute_list, grad_out.size(1))
    return torch.zeros_like(grad_out).index_add(1, source, grad_out)


KERNELS = [(f.__name__, f) for f in (
    embedding_lookup, embedding_lookup_backward, embedding_pooled_lookup, embedding_pooled_lookup_backward,
    embedding_pooled_lookup_offset, embedding_pooled_lookup_offset_backward, embedding_pooled_batched_lookup_offset,
    embedding_pooled_batched_lookup_offset_backward, permute_pooled_embs, permute_pooled_embs_backward)]
