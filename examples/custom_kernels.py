"""Custom kernels on `tpu`, three ways, each checked against PyTorch:

  (a) RMSNorm written as StableHLO text (no JAX needed), with a StableHLO backward;
  (b) softmax cross-entropy written in JAX, its backward derived by JAX (jax.vjp);
  (c) a tiled matmul written in Pallas (interpret mode off TPU), its backward the
      same kernel on transposed operands.

    python examples/custom_kernels.py

Each kernel runs eagerly (Strict), fused with the ops around it (DeferAndFuse)
and inside torch.compile (one program per graph). JAX is imported only to export
(b) and (c) for shapes not yet in the kernel cache; once cached, they run in a
process without JAX (their annotations are strings, so defining them needs none).
"""
from __future__ import annotations

import torch

import torch_tpu
from torch_tpu.kernels import TensorSpec, jax_op, stablehlo_op

try:  # only needed to export kernels that are not in the cache yet
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
except ImportError:
    jax = jnp = pl = None


# ---------------------------------------------------------------- (a) StableHLO RMSNorm
def _f32(spec):
    return TensorSpec(spec.shape, torch.float32).mlir


def rmsnorm_text(x, w, eps):
    """y = x * rsqrt(mean(x^2 over the last dim) + eps) * w, computed in float32."""
    t, r, d = x.mlir, len(x.shape), x.shape[-1]
    tf, wf, rows = _f32(x), _f32(w), TensorSpec(x.shape[:-1], torch.float32).mlir
    lead = ", ".join(str(i) for i in range(r - 1))
    up = x.dtype != torch.float32
    return f"""
module @rmsnorm {{
  func.func public @main(%x: {t}, %w: {w.mlir}) -> {t} {{
    {f"%xf = stablehlo.convert %x : ({t}) -> {tf}" if up else ""}
    {f"%wf = stablehlo.convert %w : ({w.mlir}) -> {wf}" if up else ""}
    %sq = stablehlo.multiply {"%xf, %xf" if up else "%x, %x"} : {tf}
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [{r - 1}] : ({tf}, tensor<f32>) -> {rows}
    %n = stablehlo.constant dense<{float(d):.1f}> : {rows}
    %mean = stablehlo.divide %sum, %n : {rows}
    %eps = stablehlo.constant dense<{eps:.9e}> : {rows}
    %var = stablehlo.add %mean, %eps : {rows}
    %inv = stablehlo.rsqrt %var : {rows}
    %invb = stablehlo.broadcast_in_dim %inv, dims = [{lead}] : ({rows}) -> {tf}
    %wb = stablehlo.broadcast_in_dim {"%wf" if up else "%w"}, dims = [{r - 1}] : ({wf}) -> {tf}
    %xn = stablehlo.multiply {"%xf" if up else "%x"}, %invb : {tf}
    %y = stablehlo.multiply %xn, %wb : {tf}
    {f"%yo = stablehlo.convert %y : ({tf}) -> {t}" if up else ""}
    return {"%yo" if up else "%y"} : {t}
  }}
}}"""


def rmsnorm_backward_text(x, w, dy, eps):
    """With r = rsqrt(mean(x^2) + eps) and g = dy * w:
    dx = r * g - x * r^3 * mean(g * x),  dw = sum over rows of dy * x * r (float32 only)."""
    t, tw, r, d = x.mlir, w.mlir, len(x.shape), x.shape[-1]
    rows = TensorSpec(x.shape[:-1], torch.float32).mlir
    lead = ", ".join(str(i) for i in range(r - 1))
    return f"""
module @rmsnorm_backward {{
  func.func public @main(%x: {t}, %w: {tw}, %dy: {t}) -> ({t}, {tw}) {{
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %n = stablehlo.constant dense<{float(d):.1f}> : {rows}
    %eps = stablehlo.constant dense<{eps:.9e}> : {rows}
    %inv = func.call @inv_rms(%x, %n, %eps) : ({t}, {rows}, {rows}) -> {rows}
    %invb = stablehlo.broadcast_in_dim %inv, dims = [{lead}] : ({rows}) -> {t}
    %wb = stablehlo.broadcast_in_dim %w, dims = [{r - 1}] : ({tw}) -> {t}
    %g = stablehlo.multiply %dy, %wb : {t}
    %gx = stablehlo.multiply %g, %x : {t}
    %gxs = stablehlo.reduce(%gx init: %zero) applies stablehlo.add across dimensions = [{r - 1}] : ({t}, tensor<f32>) -> {rows}
    %gxm = stablehlo.divide %gxs, %n : {rows}
    %inv2 = stablehlo.multiply %inv, %inv : {rows}
    %inv3 = stablehlo.multiply %inv2, %inv : {rows}
    %c = stablehlo.multiply %inv3, %gxm : {rows}
    %cb = stablehlo.broadcast_in_dim %c, dims = [{lead}] : ({rows}) -> {t}
    %a = stablehlo.multiply %g, %invb : {t}
    %b = stablehlo.multiply %x, %cb : {t}
    %dx = stablehlo.subtract %a, %b : {t}
    %xn = stablehlo.multiply %x, %invb : {t}
    %dwf = stablehlo.multiply %dy, %xn : {t}
    %dw = stablehlo.reduce(%dwf init: %zero) applies stablehlo.add across dimensions = [{lead}] : ({t}, tensor<f32>) -> {tw}
    return %dx, %dw : {t}, {tw}
  }}
  func.func private @inv_rms(%x: {t}, %n: {rows}, %eps: {rows}) -> {rows} {{
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sq = stablehlo.multiply %x, %x : {t}
    %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [{r - 1}] : ({t}, tensor<f32>) -> {rows}
    %mean = stablehlo.divide %sum, %n : {rows}
    %var = stablehlo.add %mean, %eps : {rows}
    %inv = stablehlo.rsqrt %var : {rows}
    return %inv : {rows}
  }}
}}"""


rmsnorm = stablehlo_op("examples::rmsnorm", rmsnorm_text, schema="(Tensor x, Tensor w, float eps) -> Tensor",
                       outputs=lambda x, w, eps: [x])
rmsnorm_backward = stablehlo_op("examples::rmsnorm_backward", rmsnorm_backward_text,
                                schema="(Tensor x, Tensor w, Tensor dy, float eps) -> (Tensor, Tensor)",
                                outputs=lambda x, w, dy, eps: [x, w])


def _rms_setup(ctx, inputs, output):
    x, w, eps = inputs
    ctx.save_for_backward(x, w)
    ctx.eps = eps


def _rms_backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx, dw = rmsnorm_backward(x, w, dy.contiguous(), ctx.eps)
    return dx, dw, None


rmsnorm.register_autograd(_rms_backward, setup_context=_rms_setup)


def rmsnorm_reference(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


# ---------------------------------------------------------------- (b) JAX softmax cross-entropy
@jax_op("examples::softmax_xent", vjp=True)
def softmax_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer labels; the backward is jax.vjp of this function."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=-1)
    return -jnp.mean(picked).astype(logits.dtype)


# ---------------------------------------------------------------- (c) Pallas tiled matmul
def _matmul_block(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


@jax_op("examples::pallas_matmul")
def pallas_matmul(x: jax.Array, y: jax.Array, block: int = 16) -> jax.Array:
    """x @ y in block x block tiles (the dimensions must be multiples of block).
    Off TPU the kernel runs in Pallas interpret mode (plain StableHLO); on a TPU it
    would lower to a Mosaic custom call (untested here: no TPU)."""
    m, k = x.shape
    n = y.shape[1]
    if m % block or n % block or k % block:
        raise ValueError(f"pallas_matmul: shapes {x.shape} @ {y.shape} are not multiples of block={block}")
    return pl.pallas_call(
        _matmul_block,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // block, n // block, k // block),
        in_specs=[pl.BlockSpec((block, block), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((block, block), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((block, block), lambda i, j, kk: (i, j)),
        interpret=jax.default_backend() != "tpu",
    )(x, y)


def _mm_setup(ctx, inputs, output):
    x, y, block = inputs
    ctx.save_for_backward(x, y)
    ctx.block = block


def _mm_backward(ctx, g):
    x, y = ctx.saved_tensors
    g = g.contiguous()
    return (pallas_matmul(g, y.t().contiguous(), ctx.block), pallas_matmul(x.t().contiguous(), g, ctx.block), None)


pallas_matmul.register_autograd(_mm_backward, setup_context=_mm_setup)


# ---------------------------------------------------------------- checks
def _check(name, got, want, tol=1e-4):
    err = max((g.detach().cpu().float() - w.detach().float()).abs().max().item() for g, w in zip(got, want))
    print(f"  {name:<44} max |error| {err:.2e}")
    assert err < tol, (name, err)


def _grads(f, *tensors):
    """Forward value and gradients of f(*tensors).sum() with respect to its float tensors."""
    leaves = [t.detach().clone().requires_grad_(t.dtype.is_floating_point) for t in tensors]
    out = f(*leaves)
    out.sum().backward()
    return [out] + [t.grad for t in leaves if t.requires_grad]


def main():
    torch.manual_seed(0)
    tpu = torch.device("tpu")
    x, w = torch.randn(8, 64), torch.randn(64)
    logits, labels = torch.randn(16, 10), torch.randint(0, 10, (16,))
    a, b = torch.randn(32, 48), torch.randn(48, 64)
    cases = [
        ("(a) StableHLO RMSNorm", lambda x, w: rmsnorm(x, w, 1e-6), lambda x, w: rmsnorm_reference(x, w, 1e-6),
         (x, w)),
        ("(b) JAX softmax cross-entropy", softmax_xent, torch.nn.functional.cross_entropy, (logits, labels)),
        ("(c) Pallas tiled matmul", pallas_matmul, torch.matmul, (a, b)),
    ]
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        for title, kernel, reference, inputs in cases:
            print(title)
            want = _grads(reference, *inputs)
            on_tpu = [t.to(tpu) for t in inputs]
            _check("Strict: forward and backward", _grads(kernel, *on_tpu), want)
            with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
                _check("DeferAndFuse: fused with the ops around it", _grads(lambda *t: kernel(*t) * 2, *on_tpu),
                       _grads(lambda *t: reference(*t) * 2, *inputs))
            compiled = torch.compile(lambda *t: kernel(*t) * 2, fullgraph=True)
            _check("torch.compile (no graph break)", _grads(compiled, *on_tpu),
                   _grads(lambda *t: reference(*t) * 2, *inputs))
    print("all kernels match their PyTorch references")


if __name__ == "__main__":
    main()
