"""torch.nn.attention.varlen.varlen_attn on tpu (aten::_flash_attention_forward/_backward in their
varlen form, torch_tpu/_flash_attention.py) against per-sequence scaled_dot_product_attention on CPU:
packed sequences, causal, full and sliding-window masks, grouped-query heads, gradients, eager and
compiled."""
import pytest
import torch
from torch.nn.attention.varlen import varlen_attn

from torch_tpu import metrics

LENS = [5, 1, 8, 3]


def packed(heads, kv_heads, dim, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(LENS)
    cu = torch.tensor([0] + torch.tensor(LENS).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = (torch.randn(total, h, dim, generator=g, dtype=dtype) for h in (heads, kv_heads, kv_heads))
    return q, k, v, cu


def reference(q, k, v, cu, window):
    """Each sequence alone through SDPA with the window as a boolean mask (bottom-right aligned)."""
    left, right = window
    outs = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        n, group = b - a, q.size(1) // k.size(1)
        i, j = torch.arange(n).unsqueeze(1), torch.arange(n).unsqueeze(0)
        mask = torch.ones(n, n, dtype=torch.bool)
        if right >= 0:
            mask &= j <= i + right
        if left >= 0:
            mask &= j >= i - left
        kk, vv = (x[a:b].transpose(0, 1).repeat_interleave(group, 0) for x in (k, v))
        outs.append(torch.nn.functional.scaled_dot_product_attention(q[a:b].transpose(0, 1), kk, vv,
                                                                      attn_mask=mask).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (2, 0), (1, 2)])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
def test_matches_per_sequence_sdpa(window, heads, kv_heads):
    q, k, v, cu = packed(heads, kv_heads, 8)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = reference(*leaves, cu, window)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    ref.backward(grad)
    metrics.reset()
    with torch.tpu.precision("highest"):
        on_tpu = [x.detach().to("tpu").requires_grad_() for x in (q, k, v)]
        cu_t = cu.to("tpu")
        out = varlen_attn(*on_tpu, cu_t, cu_t, max(LENS), max(LENS), window_size=window,
                          enable_gqa=heads != kv_heads)
        out.backward(grad.to("tpu"))
    assert out.is_contiguous() and out.shape == q.shape
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    for t, c in zip(on_tpu, leaves):
        torch.testing.assert_close(t.grad.cpu(), c.grad, rtol=1e-5, atol=1e-5)
    assert metrics.cpu_fallbacks() == {}


def test_bfloat16_and_logsumexp():
    q, k, v, cu = packed(2, 2, 16, dtype=torch.bfloat16, seed=3)
    cu_t = cu.to("tpu")
    out, lse = varlen_attn(q.to("tpu"), k.to("tpu"), v.to("tpu"), cu_t, cu_t, max(LENS), max(LENS),
                           window_size=(-1, 0), return_aux=torch.nn.attention.varlen.AuxRequest(lse=True))
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and lse.shape == (2, sum(LENS))
    ref = reference(q.float(), k.float(), v.float(), cu, (-1, 0))
    torch.testing.assert_close(out.cpu().float(), ref, rtol=2e-2, atol=2e-2)
    # the log-sum-exp of the first query of each sequence is its only score, q.k * scale
    first = cu[:-1].long()
    expected = (q.float()[first] * k.float()[first]).sum(-1).t() * 16 ** -0.5
    torch.testing.assert_close(lse.cpu()[:, first], expected, rtol=2e-2, atol=2e-2)


def test_compiled_matches_eager():
    q, k, v, cu = packed(4, 2, 8, seed=5)
    cu_t = cu.to("tpu")

    def f(q, k, v):
        return varlen_attn(q, k, v, cu_t, cu_t, max(LENS), max(LENS), window_size=(-1, 0), enable_gqa=True)

    inputs = [x.to("tpu") for x in (q, k, v)]
    eager = f(*inputs)
    compiled = torch.compile(f, backend="tpu")(*inputs)
    torch.testing.assert_close(compiled.cpu(), eager.cpu())


def test_unsupported_arguments_raise():
    q, k, v, cu = packed(2, 2, 8)
    args = [x.to("tpu") for x in (q, k, v, cu, cu)] + [max(LENS), max(LENS)]
    with pytest.raises(NotImplementedError, match="dropout"):
        torch.ops.aten._flash_attention_forward(*args, 0.1, True, False)
    with pytest.raises(NotImplementedError, match="block_table"):
        torch.ops.aten._flash_attention_forward(*args, 0.0, True, False,
                                                block_table=torch.zeros(1, 1, dtype=torch.int32, device="tpu"))
    with pytest.raises(NotImplementedError, match="padded"):
        torch.ops.aten._flash_attention_forward(q.unsqueeze(0).to("tpu"), k.unsqueeze(0).to("tpu"),
                                                v.unsqueeze(0).to("tpu"), None, None, 8, 8, 0.0, True, False)


def test_a_score_tensor_too_big_for_the_device_is_refused():
    total = torch.tpu.get_device_properties(0).total_memory
    tokens = int((total / 4 / 2) ** 0.5) + 1  # 2 heads x tokens^2 floats > a quarter of the memory
    q = torch.empty(tokens, 2, 8, device="tpu")
    cu = torch.tensor([0, tokens], dtype=torch.int32, device="tpu")
    with pytest.raises(torch.OutOfMemoryError, match="pack fewer tokens per call"):
        varlen_attn(q, q, q, cu, cu, tokens, tokens, window_size=(-1, 0))
