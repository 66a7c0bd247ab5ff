"""Training integrations (docs/BENCHMARKS.md, "Training integrations"): an embedding-bag
collection as TorchRec's unsharded EmbeddingBagCollection computes it (one nn.EmbeddingBag per
table, pooled sums concatenated), forward + backward + SGD step, lookups per second on tpu in
Strict, DeferAndFuse and compiled mode against PyTorch on CPU, measured side by side in one run
(alternating rounds, best of each).

  python bench/bench_integrations.py [--tables 8] [--rows 20000] [--dim 64] [--batch 512] [--pool 20]

With --torchrec (in .venv-train): TorchRec's own EmbeddingBagCollection on a KeyedJaggedTensor.

With --torchtitan ASSETS (in .venv-train, ASSETS from examples/torchtitan/prepare_assets.py):
TorchTitan's Llama 3 debug model trained from its own CLI on 1 and 2 ranks in Strict,
DeferAndFuse (TORCH_TPU_DEFER_AND_FUSE=1) and with --compile on the tpu backend; tokens/s
per rank, TFLOPS and MFU as TorchTitan reports them (median over the steps after warm-up).

  .venv-train/bin/python bench/bench_integrations.py --torchtitan /tmp/titan_assets [--seq-len 128] [--steps 12]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
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


class TorchRecCollection(nn.Module):
    """TorchRec's own EmbeddingBagCollection (in .venv-train), fed a KeyedJaggedTensor."""

    def __init__(self, tables, rows, dim):
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

        self.keys = [f"f{t}" for t in range(tables)]
        self.ebc = EmbeddingBagCollection(device=torch.device("cpu"), tables=[
            EmbeddingBagConfig(name=f"t{t}", embedding_dim=dim, num_embeddings=rows, feature_names=[k])
            for t, k in enumerate(self.keys)])

    def forward(self, indices, offsets):
        from torchrec import KeyedJaggedTensor

        tables, batch = offsets.shape  # fixed pooling: every bag holds indices.size(1) // batch ids
        lengths = torch.full((tables * batch,), indices.size(1) // batch, device=indices.device, dtype=torch.int32)
        kjt = KeyedJaggedTensor(keys=self.keys, values=indices.reshape(-1), lengths=lengths)
        return self.ebc(kjt).values()


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
    model = (TorchRecCollection if a.torchrec else Collection)(a.tables, a.rows, a.dim).to(device)
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


TITAN_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+).*?tps:\s*([0-9,]+)\s+tflops:\s*([0-9.]+)\s+mfu:\s*([0-9.]+)%")


def titan_run(assets, ranks, mode, seq_len, steps):
    """One TorchTitan run; returns (median tokens/s per rank, TFLOPS, MFU %) over the steps after
    the first two (compiles), and the first and last loss."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    extra = []
    if mode == "fuse":
        env["TORCH_TPU_DEFER_AND_FUSE"] = "1"
    elif mode == "compiled":
        extra = ["--compile.enable", "--compile.backend", "tpu"]
    if ranks > 1:
        extra += ["--parallelism.data-parallel-shard-degree", str(ranks)]
    with tempfile.TemporaryDirectory() as dump:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--rdzv_backend", "c10d",
               "--rdzv_endpoint", "localhost:0", "--local-ranks-filter", "0", "-m", "torchtitan.train",
               "--model.name", "llama3", "--model.flavor", "debugmodel",
               "--model.hf-assets-path", os.path.join(assets, "tokenizer"),
               "--training.dataset-path", os.path.join(assets, "c4_test"), "--training.seq-len", str(seq_len),
               "--training.steps", str(steps), "--metrics.log-freq", "1", "--metrics.disable-color-printing",
               "--job.dump-folder", dump, *extra]
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    rows = [(int(m[0]), float(m[1]), int(m[2].replace(",", "")), float(m[3]), float(m[4]))
            for m in TITAN_STEP.findall(out)]
    if len(rows) != steps:
        raise RuntimeError(f"TorchTitan ({ranks} ranks, {mode}) did not finish:\n{out[-4000:]}")
    later = rows[2:]
    return (statistics.median(r[2] for r in later), statistics.median(r[3] for r in later),
            statistics.median(r[4] for r in later), rows[0][1], rows[-1][1])


def titan_main(a):
    results = {}
    for ranks in (1, 2):
        for mode in ("strict", "fuse", "compiled"):
            results[ranks, mode] = titan_run(a.torchtitan, ranks, mode, a.seq_len, a.steps)
    print(f"TorchTitan llama3 debugmodel, seq_len {a.seq_len}, local batch 8, {a.steps} steps (median of steps "
          f"3-{a.steps}); torch_tpu on {torch.tpu.get_device_name()}")
    print("| ranks | mode | tokens/s per rank | vs Strict | TFLOPS | MFU (TorchTitan) | loss first -> last |\n"
          "|---|---|---|---|---|---|---|")
    for (ranks, mode), (tps, tflops, mfu, first, last) in results.items():
        print(f"| {ranks} | {mode} | {tps:,.0f} | {tps / results[ranks, 'strict'][0]:.2f}x | {tflops:.2f} | "
              f"{mfu:.2f}% | {first:.3f} -> {last:.3f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torchtitan", metavar="ASSETS", help="benchmark TorchTitan instead (see the docstring)")
    ap.add_argument("--torchrec", action="store_true", help="TorchRec's EmbeddingBagCollection and KJT input")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--pool", type=int, default=20)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.torchtitan:
        return titan_main(a)
    names = ["cpu", "strict", "fuse", "compiled"]
    best = {}
    for r in range(a.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            t = measure(name, a, a.iters)
            best[name] = min(best.get(name, t), t)
    lookups = a.tables * a.batch * a.pool
    print(f"{'TorchRec EmbeddingBagCollection' if a.torchrec else 'embedding-bag collection'}: {a.tables} tables x {a.rows} rows x {a.dim}, batch {a.batch}, "
          f"pooling {a.pool}; forward + backward + SGD, best of {a.rounds} rounds x {a.iters} steps; "
          f"{torch_tpu.__name__} on {torch.tpu.get_device_name()}")
    print("| run | ms / step | lookups / s | vs CPU |\n|---|---|---|---|")
    for name in names:
        t = best[name]
        print(f"| {name} | {t * 1000:.1f} | {lookups / t / 1e6:.2f} M | {best['cpu'] / t:.2f}x |")


if __name__ == "__main__":
    main()
