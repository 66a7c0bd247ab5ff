"""scaled_dot_product_attention on tpu through PyTorch's fused backend for out-of-tree devices
(`_scaled_dot_product_fused_attention_overrideable`, torch_tpu/_flash_attention.py): results and
gradients equal CPU's, the backward keeps the log-sum-exp instead of the (L, S) probabilities,
and what the fused kernel does not cover takes the math path."""
import contextlib
import functools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_tpu import metrics

B, H, L, S, E = 2, 3, 5, 7, 8


def inputs(seed=0, shapes=((B, H, L, E), (B, H, S, E), (B, H, S, E))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


def attend(device, tensors, **kwargs):
    leaves = [t.to(device).requires_grad_() for t in tensors]
    mask = kwargs.pop("attn_mask", None)
    out = F.scaled_dot_product_attention(*leaves, attn_mask=None if mask is None else mask.to(device), **kwargs)
    out.backward(torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).to(device) / out.numel())
    return out, [t.grad.cpu() for t in leaves]


MASK = torch.rand(L, S, generator=torch.Generator().manual_seed(3)) > 0.3
MASK[1] = False  # a query that sees no key: zeros, as the math path's safe softmax gives


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"attn_mask": MASK}, {"scale": 0.3},
                                    {"attn_mask": torch.randn(B, 1, L, S, generator=torch.Generator().manual_seed(4))}],
                         ids=["plain", "causal", "bool_mask", "scale", "float_mask"])
def test_matches_cpu_through_the_fused_backend(kwargs):
    metrics.reset()
    ref, ref_grads = attend("cpu", inputs(), **dict(kwargs))
    with torch.tpu.precision("highest"):
        out, grads = attend("tpu", inputs(), **dict(kwargs))
    assert type(out.grad_fn).__name__ == "ScaledDotProductFusedAttentionOverrideableBackward0"
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    assert metrics.cpu_fallbacks() == {}


def test_backward_keeps_no_score_matrix():
    q = torch.randn(2, 4, 64, 16, device="tpu", requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert saved and all(s[-2:] != (64, 64) for s in saved), saved
    with sdpa_kernel(SDPBackend.MATH), torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        saved.clear()
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert any(s[-2:] == (64, 64) for s in saved), saved  # the math path keeps the probabilities


def test_output_has_the_querys_layout():
    q, k, v = (t.to("tpu").transpose(1, 2).contiguous().transpose(1, 2) for t in inputs())  # (B, L, H, E) memory
    out = F.scaled_dot_product_attention(q, k, v)
    assert out.stride() == q.stride()
    out.transpose(1, 2).view(B, L, H * E)  # MultiheadAttention and HF models view it this way


@pytest.mark.parametrize("case", ["dropout", "gqa", "mask_with_grad", "math_only"])
def test_what_the_fused_kernel_does_not_cover_takes_the_math_path(case):
    q, k, v = inputs()
    kwargs, context = {}, contextlib.nullcontext()
    if case == "dropout":
        kwargs["dropout_p"] = 0.5
    elif case == "gqa":
        q = torch.randn(B, 6, L, E)
        kwargs["enable_gqa"] = True
    elif case == "mask_with_grad":
        kwargs["attn_mask"] = torch.randn(L, S, device="tpu", requires_grad=True)
    else:
        context = sdpa_kernel(SDPBackend.MATH)
    with context:
        out = F.scaled_dot_product_attention(*(t.to("tpu").requires_grad_() for t in (q, k, v)), **kwargs)
    assert "Overrideable" not in type(out.grad_fn).__name__
    out.sum().backward()
    if case == "gqa":
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.testing.assert_close(out.detach().cpu(), ref, rtol=1e-2, atol=1e-2)


def _sac_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(E * H, 3 * E * H)

    def forward(self, x):
        q, k, v = (t.unflatten(-1, (H, E)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


@pytest.mark.parametrize("checkpointing", ["none", "selective"])
def test_compiled_attention_traces_the_math_path(checkpointing):
    """torch.compile traces FakeTensors: SDPA's choice is the math path there, so the graph holds
    plain ops. With selective activation checkpointing (TorchTitan's default) a traced fused op
    would be recomputed under run_and_save_rng_state, which has no tpu backend."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(B, L, H * E)

    def forward(module, inp):
        if checkpointing == "selective":  # inside the compiled region, as TorchTitan applies it
            return checkpoint(module, inp, use_reentrant=False,
                              context_fn=functools.partial(create_selective_checkpoint_contexts, _sac_policy))
        return module(inp)

    def step(module, inp, run):
        out = run(module, inp)
        out.square().sum().backward()
        return out.detach().cpu(), [p.grad.cpu() for p in module.parameters()]

    ref, ref_grads = step(block, x, forward)
    tpu_block = _Block().to("tpu")
    tpu_block.load_state_dict(block.state_dict())
    torch._dynamo.reset()
    with torch.tpu.precision("highest"):
        out, grads = step(tpu_block, x.to("tpu"), torch.compile(forward, backend="tpu"))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
