"""Training integrations (docs/BENCHMARKS.md, "Training integrations"): an embedding-bag
collection as TorchRec's unsharded EmbeddingBagCollection computes it (one nn.EmbeddingBag per
table, pooled sums concatenated), forward + backward + SGD step, lookups per second on tpu in
Strict, DeferAndFuse and compiled mode against PyTorch on CPU, measured side by side in one run
(alternating rounds, best of each).

  python bench/bench_integrations.py [--tables 8] [--rows 20000] [--dim 64] [--batch 512] [--pool 20]
"""
import argparse
import time

import torch
import torch.nn as nn

import torch_tpu


class Collection(nn.Module):
    def __init__(self, tables, rows, dim):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))

    def forward(self, indices, offsets):  # indices (tables, batch * pool), offsets (tables, batch)
        return torch.cat([bag(indices[t], offsets[t]) for t, bag in enumerate(self.bags)], dim=1)


def make_step(model, device, compiled):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fwd = torch.compile(model, backend="tpu") if compiled else model

    def step(indices, offsets):
        out = fwd(indices, offsets)
        loss = out.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def measure(name, a, iters):
    device = "cpu" if name == "cpu" else "tpu"
    torch.manual_seed(0)
    model = Collection(a.tables, a.rows, a.dim).to(device)
    n = a.batch * a.pool
    indices = torch.randint(0, a.rows, (a.tables, n)).to(device)
    offsets = torch.arange(0, n, a.pool).repeat(a.tables, 1).to(device)
    step = make_step(model, device, compiled=(name == "compiled"))
    mode = torch_tpu.EagerMode.DEFER_AND_FUSE if name == "fuse" else torch_tpu.EagerMode.DEFER_NEVER
    with torch_tpu.eager_mode(mode):
        for _ in range(3):  # warm-up (compiles)
            step(indices, offsets).item()
        t0 = time.perf_counter()
        for _ in range(iters):
            loss = step(indices, offsets)
        loss.item()
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--pool", type=int, default=20)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    names = ["cpu", "strict", "fuse", "compiled"]
    best = {}
    for r in range(a.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            t = measure(name, a, a.iters)
            best[name] = min(best.get(name, t), t)
    lookups = a.tables * a.batch * a.pool
    print(f"embedding-bag collection: {a.tables} tables x {a.rows} rows x {a.dim}, batch {a.batch}, "
          f"pooling {a.pool}; forward + backward + SGD, best of {a.rounds} rounds x {a.iters} steps; "
          f"{torch_tpu.__name__} on {torch.tpu.get_device_name()}")
    print("| run | ms / step | lookups / s | vs CPU |\n|---|---|---|---|")
    for name in names:
        t = best[name]
        print(f"| {name} | {t * 1000:.1f} | {lookups / t / 1e6:.2f} M | {best['cpu'] / t:.2f}x |")


if __name__ == "__main__":
    main()
