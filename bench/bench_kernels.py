"""A fused RMSNorm kernel (StableHLO text, examples/custom_kernels.py) against the
same math in eager PyTorch ops on tpu, in Strict and DeferAndFuse mode.

  python bench/bench_kernels.py

Each timed run applies RMSNorm 20 times in a chain (y = rmsnorm(y, w)) and waits
for the device; the table gives the time per RMSNorm (median of the runs) and
the ratio eager ops / kernel. The eager version is 6 ops (pow, mean, add, rsqrt,
mul, mul); the kernel is one op whose program is the kernel inlined.
"""
import os
import statistics
import sys
import time

import torch

import torch_tpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import custom_kernels as ex  # noqa: E402

CHAIN = 20


def eager_rmsnorm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def kernel_rmsnorm(x, w, eps=1e-6):
    return ex.rmsnorm(x, w, eps)


def per_call(f, x, w, mode, reps):
    with torch_tpu.eager_mode(mode):
        def run():
            y = x
            for _ in range(CHAIN):
                y = f(y, w)
            torch.tpu.synchronize()
            return y
        run(), run()  # compile, record traces
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) / CHAIN


def jax_reference(shape, reps):
    """The same chain under jax.jit on JAX's own CPU client: all 20 in one program
    vs one program per RMSNorm (context for the DeferAndFuse rows)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None

    def rms(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w

    one = jax.jit(rms)

    @jax.jit
    def chain(x, w):
        for _ in range(CHAIN):
            x = rms(x, w)
        return x

    x, w = jnp.ones(shape, jnp.float32), jnp.ones(shape[-1:], jnp.float32)
    out = []
    for f, n in ((one, CHAIN), (chain, 1)):
        def run():
            y = x
            for _ in range(n):
                y = f(y, w)
            y.block_until_ready()
        run(), run()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times) / CHAIN)
    return out


def main():
    torch.manual_seed(0)
    print(f"plugin: {torch.tpu.get_device_name()}; time per RMSNorm over a chain of {CHAIN}, median")
    print("| input | mode | eager ops | kernel | eager / kernel |")
    print("|---|---|---|---|---|")
    for shape, reps in (((64, 512), 30), ((2048, 1024), 10)):
        x = torch.randn(*shape, device="tpu")
        w = torch.randn(shape[-1], device="tpu")
        diff = (eager_rmsnorm(x, w) - kernel_rmsnorm(x, w)).abs().max().item()
        assert diff < 1e-4, diff
        for name, mode in (("Strict", torch_tpu.EagerMode.DEFER_NEVER),
                           ("DeferAndFuse", torch_tpu.EagerMode.DEFER_AND_FUSE)):
            te = per_call(eager_rmsnorm, x, w, mode, reps)
            tk = per_call(kernel_rmsnorm, x, w, mode, reps)
            print(f"| {shape[0]}x{shape[1]} float32 | {name} | {te * 1e6:.0f} us | {tk * 1e6:.0f} us | {te / tk:.2f}x |")
        ref = jax_reference(shape, reps)
        if ref:
            print(f"| {shape[0]}x{shape[1]} float32 | jax.jit reference: one program per RMSNorm / all {CHAIN} in one "
                  f"| | {ref[0] * 1e6:.0f} / {ref[1] * 1e6:.0f} us | |")


if __name__ == "__main__":
    main()
