"""Attention kernels written as compositions of lowered ops: the fused scaled_dot_product_attention
backend (at the end of this file) and variable-length attention.

Variable-length attention on tpu: `aten::_flash_attention_forward` / `_backward` in their
varlen form (3-D `(tokens, heads, head_dim)` inputs packed by `cum_seq_q` / `cum_seq_k`), the ops
`torch.nn.attention.varlen.varlen_attn` reaches through its `torch_attn::` custom ops (TorchTitan's
`varlen` attention, packed-sequence training).

A composition of lowered ops at PrivateUse1: the scores of every query with every key in float32,
masked to the query's own sequence (and to the causal band or sliding window, aligned to the
bottom right as FlashAttention aligns sequences of different lengths), a row softmax kept as its
log-sum-exp, and the backward recomputed from that log-sum-exp. It is exact attention, quadratic
in the packed token count (one (heads, tokens_q, tokens_k) score tensor): meant for the packed
batches of a training step, not for very long contexts (a score tensor over a quarter of the
device's memory raises torch.OutOfMemoryError with the sizes). Grouped-query attention (fewer key/value
heads) is supported; dropout, ALiBi, paged KV (`block_table`) and `seqused_k` raise
NotImplementedError.
"""
import torch

from ._jagged import segments


def _unsupported(what):
    raise NotImplementedError(f"_flash_attention_forward on tpu: {what} is not supported")


def _allowed(cum_seq_q, cum_seq_k, total_q, total_k, is_causal, window_left, window_right):
    """(total_q, total_k) bool: which keys each query attends to."""
    def locate(cum, total):
        token, seq, inside = segments(cum, total)
        return seq, token - cum.index_select(0, seq), inside

    seq_q, pos_q, in_q = locate(cum_seq_q, total_q)
    seq_k, pos_k, in_k = locate(cum_seq_k, total_k)
    len_q = (cum_seq_q[1:] - cum_seq_q[:-1]).index_select(0, seq_q)
    len_k = (cum_seq_k[1:] - cum_seq_k[:-1]).index_select(0, seq_q)
    allowed = (seq_q.unsqueeze(1) == seq_k.unsqueeze(0)) & in_q.unsqueeze(1) & in_k.unsqueeze(0)
    diagonal = (pos_q + len_k - len_q).unsqueeze(1)  # the key aligned with each query
    right = 0 if is_causal else window_right
    if right is not None and right >= 0:
        allowed = allowed & (pos_k.unsqueeze(0) <= diagonal + right)
    if window_left is not None and window_left >= 0:
        allowed = allowed & (pos_k.unsqueeze(0) >= diagonal - window_left)
    return allowed


def _heads_first(x, heads):
    """(tokens, kv_heads, dim) -> (heads, tokens, dim) in float32, kv heads repeated for GQA."""
    x = x.float().transpose(0, 1)
    return x.repeat_interleave(heads // x.size(0), dim=0) if x.size(0) != heads else x


def _check_size(query, key):
    """The score tensor must fit: refuse early, with the numbers, rather than exhaust the device."""
    score_bytes = 4 * query.size(1) * query.size(0) * key.size(0)
    total = torch.tpu.get_device_properties(query.device).total_memory
    if total and score_bytes > total // 4:
        raise torch.OutOfMemoryError(
            f"varlen attention on tpu holds a float32 (heads, tokens_q, tokens_k) score tensor: "
            f"{query.size(1)} x {query.size(0)} x {key.size(0)} is {score_bytes / 2**30:.1f} GiB, over a quarter of "
            f"the device's {total / 2**30:.1f} GiB; pack fewer tokens per call (a shorter sequence or a smaller batch)")


def _probabilities(query, key, cum_seq_q, cum_seq_k, is_causal, scale, window_left, window_right, lse=None):
    _check_size(query, key)
    heads = query.size(1)
    q, k = _heads_first(query, heads), _heads_first(key, heads)
    scale = scale if scale is not None else query.size(-1) ** -0.5
    scores = torch.matmul(q, k.transpose(1, 2)) * scale
    allowed = _allowed(cum_seq_q, cum_seq_k, query.size(0), key.size(0), is_causal, window_left, window_right)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # a query with no key attends to nothing
    return torch.exp(scores - finite.unsqueeze(-1)), lse, q, k, scale


def _sum_groups(x, kv_heads):
    """(heads, tokens, dim) -> (kv_heads, tokens, dim): the gradient of the repeat for GQA."""
    heads = x.size(0)
    return x if heads == kv_heads else x.reshape(kv_heads, heads // kv_heads, *x.shape[1:]).sum(dim=1)


def flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                            return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                            seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None):
    if cum_seq_q is None or cum_seq_k is None or query.dim() != 3:
        _unsupported("the padded (4-D) form; tpu's scaled_dot_product_attention covers it")
    if dropout_p:
        _unsupported("dropout")
    for name, arg in (("seqused_k", seqused_k), ("alibi_slopes", alibi_slopes), ("block_table", block_table)):
        if arg is not None:
            _unsupported(name)
    if query.size(1) % key.size(1) or key.size(1) != value.size(1):
        raise RuntimeError(f"_flash_attention_forward: {query.size(1)} query heads do not group over "
                           f"{key.size(1)} key and {value.size(1)} value heads")
    p, lse, _, _, _ = _probabilities(query, key, cum_seq_q, cum_seq_k, is_causal, scale, window_size_left,
                                     window_size_right)
    # (tokens, heads, dim) contiguous, as FlashAttention writes it (callers view it flat)
    out = torch.matmul(p, _heads_first(value, query.size(1))).transpose(0, 1).to(query.dtype).contiguous()
    rng_state = torch.zeros(2, dtype=torch.uint64, device=query.device)
    empty = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, rng_state, torch.empty(0, dtype=torch.uint64, device=query.device), empty


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                             dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                             window_size_right=None):
    if dropout_p:
        _unsupported("dropout")
    heads, kv_heads = query.size(1), key.size(1)
    p, _, q, k, scale = _probabilities(query, key, cum_seq_q, cum_seq_k, is_causal, scale, window_size_left,
                                       window_size_right, lse=logsumexp)
    v = _heads_first(value, heads)
    d_out = grad_out.float().transpose(0, 1)
    d_value = torch.matmul(p.transpose(1, 2), d_out)
    d_p = torch.matmul(d_out, v.transpose(1, 2))
    row = (d_out * out.float().transpose(0, 1)).sum(dim=-1, keepdim=True)
    d_scores = p * (d_p - row) * scale
    d_query = torch.matmul(d_scores, k)
    d_key = torch.matmul(d_scores.transpose(1, 2), q)
    return tuple(g.transpose(0, 1).to(x.dtype).contiguous() for g, x in (
        (d_query, query), (_sum_groups(d_key, kv_heads), key), (_sum_groups(d_value, kv_heads), value)))


# --- scaled_dot_product_attention: the fused ("overrideable") backend PyTorch offers out-of-tree
# devices. tpu's _fused_sdp_choice picks it when there is no dropout, no grouped-query expansion
# and no mask that needs a gradient (csrc/aten/dispatch/kernels.cpp); otherwise the math path runs. Like
# FlashAttention it keeps the log-sum-exp, not the probabilities, for the backward: a layer's
# (batch, heads, L, S) scores live only while its forward or backward runs.

def _dense_probabilities(query, key, attn_bias, is_causal, scale, lse=None):
    scale = scale if scale is not None else query.size(-1) ** -0.5
    q, k = query.float(), key.float()
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if is_causal:  # top-left aligned, as scaled_dot_product_attention's is_causal
        allowed = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_bias is not None and attn_bias.numel():
        scores = scores + attn_bias.float()
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)
    finite = lse.masked_fill(torch.isinf(lse), 0)  # a fully masked row attends to nothing
    return torch.exp(scores - finite.unsqueeze(-1)), lse, q, k, scale


def _in_layout_of(like, values):
    """values (contiguous) in a tensor whose dims are laid out in like's order, as the fused
    kernels write their results (callers view them assuming it, e.g. MultiheadAttention)."""
    order = sorted(range(like.dim()), key=lambda d: like.stride(d), reverse=True)
    values = values.to(like.dtype)
    if order == list(range(like.dim())):
        return values.contiguous()
    return values.permute(order).contiguous().permute([order.index(d) for d in range(like.dim())])


def sdpa_fused_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                       *, scale=None):
    if dropout_p:
        raise NotImplementedError("the fused scaled_dot_product_attention on tpu has no dropout (the math path does)")
    p, lse, _, _, _ = _dense_probabilities(query, key, attn_bias, is_causal, scale)
    out = _in_layout_of(query, torch.matmul(p, value.float()))
    # no dropout, so no philox state: placeholders that run no program (as CUDA's flash kernel returns)
    seed, offset = (query.new_empty((), dtype=torch.int64) for _ in range(2))
    return out, lse, None, None, query.size(-2), key.size(-2), seed, offset, None


def sdpa_fused_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                        cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    p, _, q, k, scale = _dense_probabilities(query, key, attn_bias, is_causal, scale, lse=logsumexp)
    d_out = grad_out.float()
    d_value = torch.matmul(p.transpose(-2, -1), d_out)
    d_p = torch.matmul(d_out, value.float().transpose(-2, -1))
    d_scores = p * (d_p - (d_out * out.float()).sum(dim=-1, keepdim=True))
    d_query = torch.matmul(d_scores, k)
    d_key = torch.matmul(d_scores.transpose(-2, -1), q)
    d_bias = None
    if grad_input_mask[3] and attn_bias is not None and attn_bias.numel():
        d_bias = _in_layout_of(attn_bias, d_scores.sum_to_size(attn_bias.shape))
    return (_in_layout_of(query, d_query * scale), _in_layout_of(key, d_key * scale),
            _in_layout_of(value, d_value), d_bias)


KERNELS = [("_flash_attention_forward", flash_attention_forward, "PrivateUse1"),
           ("_flash_attention_backward", flash_attention_backward, "PrivateUse1"),
           ("_scaled_dot_product_fused_attention_overrideable", sdpa_fused_forward, "PrivateUse1"),
           ("_scaled_dot_product_fused_attention_overrideable_backward", sdpa_fused_backward, "PrivateUse1")]
