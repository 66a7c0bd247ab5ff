"""Differential fuzz test: random programs of a few dozen ops (elementwise,
reductions, views, in-place updates through views, matmuls, indexing, random
ops with fixed seeds) run under Strict, DeferAndFuse and PyTorch CPU, and must
agree. CI runs a fixed set of seeds; TORCH_TPU_FUZZ_PROGRAMS=N runs more."""
import os
import random

import pytest
import torch

import torch_tpu

N_PROGRAMS = int(os.environ.get("TORCH_TPU_FUZZ_PROGRAMS", "8"))
R, C = 4, 6


def make_program(seed, n_ops=30):
    """A program is a list of op closures over a pool of [R, C] tensors."""
    rng = random.Random(seed)
    ops = []
    for _ in range(n_ops):
        kind = rng.choice(["unary", "binary", "reduce", "view", "inplace", "matmul", "index", "random", "scalar"])
        a, b, c = rng.randrange(8), rng.randrange(8), rng.randrange(8)
        k = round(rng.uniform(-2, 2), 3)
        if kind == "unary":
            f = rng.choice([lambda x: torch.tanh(x), lambda x: torch.exp(x * 0.1), torch.relu, torch.sigmoid,
                            torch.abs, torch.neg, lambda x: torch.sin(x)])
            ops.append(("set", a, lambda p, f=f, b=b: f(p[b])))
        elif kind == "binary":
            f = rng.choice([torch.add, torch.mul, torch.sub, torch.maximum,
                            lambda x, y: torch.where(x > 0, x, y)])
            ops.append(("set", a, lambda p, f=f, b=b, c=c: f(p[b], p[c])))
        elif kind == "scalar":
            ops.append(("set", a, lambda p, b=b, k=k: p[b] * k + (k / 2)))
        elif kind == "reduce":
            f = rng.choice([lambda x: x.sum(1, keepdim=True).expand(R, C) * 0.1,
                            lambda x: x.mean(0, keepdim=True) + x,
                            lambda x: x - x.amax(1, keepdim=True),
                            lambda x: torch.softmax(x, 1)])
            ops.append(("set", a, lambda p, f=f, b=b: f(p[b])))
        elif kind == "view":
            f = rng.choice([lambda x, y: x.t().contiguous().t() + y,
                            lambda x, y: x.flip(0) - y,
                            lambda x, y: torch.cat([x[:, :3], y[:, 3:]], 1),
                            lambda x, y: x.view(C, R).t().reshape(R, C) * 0.5 + y[:, [5, 4, 3, 2, 1, 0]]])
            ops.append(("set", a, lambda p, f=f, b=b, c=c: f(p[b], p[c])))
        elif kind == "inplace":
            col, row = rng.randrange(C), rng.randrange(R)
            f = rng.choice([lambda x, y: x[:, col].mul_(k),
                            lambda x, y: x[1:3].add_(y[1:3]),
                            lambda x, y: x.t()[col].fill_(k),
                            lambda x, y: x[row].copy_(y[(row + 1) % R]),
                            lambda x, y: x.diagonal().sub_(1.0)])
            ops.append(("mutate", a, lambda p, f=f, a=a, b=b: f(p[a], p[b])))
        elif kind == "matmul":
            ops.append(("set", a, lambda p, b=b, c=c: (p[b] @ p[c].t()) @ p[b] * 0.05))
        elif kind == "index":
            idx = [rng.randrange(C) for _ in range(C)]
            ridx = [rng.randrange(R) for _ in range(R)]
            f = rng.choice([lambda x, d: x.index_select(1, torch.tensor(idx, device=d)),
                            lambda x, d: x[torch.tensor(ridx, device=d)],
                            lambda x, d: x.gather(1, torch.tensor([idx[:C]] * R, device=d))])
            ops.append(("index", a, lambda p, d, f=f, b=b: f(p[b], d)))
        else:
            ops.append(("random", a, None))
    return ops


def run_program(ops, device, rand_values):
    """Runs on `device`; rand_values: list to fill (tpu) or to replay (cpu)."""
    g = torch.Generator().manual_seed(0)
    pool = [torch.randn(R, C, generator=g).to(device) for _ in range(8)]
    replay = device == "cpu"
    it = iter(rand_values) if replay else None
    for op, target, fn in ops:
        if op == "set":
            pool[target] = fn(pool)
        elif op == "mutate":
            fn(pool)
        elif op == "index":
            pool[target] = fn(pool, device)
        elif op == "random":
            if replay:
                pool[target] = next(it).clone()
            else:
                v = torch.rand(R, C, device=device) - 0.5
                rand_values.append(v.cpu())
                pool[target] = v
    return [t.cpu() for t in pool]


@pytest.mark.parametrize("seed", list(range(N_PROGRAMS)))
def test_strict_fuse_and_cpu_agree(seed):
    ops = make_program(seed)
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        torch.tpu.manual_seed(seed)
        rand_strict = []
        with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_NEVER):
            strict = run_program(ops, "tpu", rand_strict)
        torch.tpu.manual_seed(seed)
        rand_fuse = []
        with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
            fused = run_program(ops, "tpu", rand_fuse)
        cpu = run_program(ops, "cpu", rand_strict)
    for a, b in zip(rand_strict, rand_fuse):
        assert torch.equal(a, b)  # the same draws in both modes
    for s, f, c in zip(strict, fused, cpu):
        torch.testing.assert_close(f, s, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s, c, rtol=1e-4, atol=1e-4)
