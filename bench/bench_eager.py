"""Side-by-side eager benchmarks (one run, one machine; report ratios).

  python bench/bench_eager.py            # all
  python bench/bench_eager.py --only op  # (a) cached small-op latency
  python bench/bench_eager.py --only gpt # (b) train_gpt step time

(a) latency of a cached small op (add of two 1k-element float32 tensors) in
    Strict mode against the same op on PyTorch CPU;
(b) train_gpt step time on tpu (Strict, and DeferAndFuse when available)
    against PyTorch CPU eager, same model and batch.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


def op_latency(device, n=3000, reps=5):
    x = torch.randn(1024, device=device)
    y = torch.randn(1024, device=device)
    for _ in range(50):
        z = x + y
    if device == "tpu":
        torch.tpu.synchronize()
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            z = x + y
        if device == "tpu":
            torch.tpu.synchronize()
        best.append((time.perf_counter() - t0) / n)
    return min(best), statistics.median(best)


def gpt_steps(device, steps, mode=None, batch=16, block=32):
    import torch.nn.functional as F
    import train_gpt as tg

    if device == "tpu":
        import torch_tpu

        torch_tpu.set_eager_mode(mode)
    torch.manual_seed(0)
    data = tg.CharData(tg.make_corpus(), block, device)
    model = tg.GPT(data.vocab, block=block).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = data.batch(batch, gen)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    if device == "tpu":
        import torch_tpu

        torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_NEVER)
    steady = times[steps // 2:]
    return statistics.median(steady), times[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["op", "gpt"], default=None)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    import torch_tpu

    print(f"tpu runs on: {torch.tpu.get_device_name()}; torch {torch.__version__}; threads {torch.get_num_threads()}")
    if args.only in (None, "op"):
        cpu_best, cpu_med = op_latency("cpu")
        tpu_best, tpu_med = op_latency("tpu")
        print(f"(a) add 1k f32, cached, per op: cpu {cpu_med * 1e6:.1f} us, tpu Strict {tpu_med * 1e6:.1f} us, "
              f"ratio tpu/cpu {tpu_med / cpu_med:.1f}x")
    if args.only in (None, "gpt"):
        cpu_step, _ = gpt_steps("cpu", args.steps)
        strict_step, strict_first = gpt_steps("tpu", args.steps, torch_tpu.EagerMode.DEFER_NEVER)
        line = (f"(b) train_gpt step (median of steady steps): cpu {cpu_step * 1e3:.1f} ms, "
                f"tpu Strict {strict_step * 1e3:.1f} ms (ratio tpu/cpu {strict_step / cpu_step:.2f}x)")
        fuse_step, fuse_first = gpt_steps("tpu", args.steps, torch_tpu.EagerMode.DEFER_AND_FUSE)
        line += (f", tpu DeferAndFuse {fuse_step * 1e3:.1f} ms (ratio tpu/cpu {fuse_step / cpu_step:.2f}x, "
                 f"Strict/DeferAndFuse {strict_step / fuse_step:.2f}x)")
        print(line)


if __name__ == "__main__":
    main()
