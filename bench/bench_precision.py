"""Cost and accuracy of the matmul precision modes, side by side in one run.

  python bench/bench_precision.py

Reports, per mode: time of a large float32 matmul and of a train_gpt step,
relative to DEFAULT, and the matmul's relative error against float64.
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_eager import gpt_steps  # noqa: E402

P = torch.tpu.Precision


def matmul_time(mode, n=1024, reps=5):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g)
    b = torch.randn(n, n, generator=g)
    ref = a.double() @ b.double()
    at, bt = a.to("tpu"), b.to("tpu")
    with torch.tpu.precision(mode):
        c = at @ bt
        c.cpu()  # compile + warm up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            c = at @ bt
            torch.tpu.synchronize()
            times.append(time.perf_counter() - t0)
    err = ((c.cpu().double() - ref).norm() / ref.norm()).item()
    return statistics.median(times), err


def main():
    import torch_tpu

    print(f"tpu runs on: {torch.tpu.get_device_name()}")
    rows = []
    for mode in P:
        t, err = matmul_time(mode)
        with torch.tpu.precision(mode):
            step, _ = gpt_steps("tpu", 30, torch_tpu.EagerMode.DEFER_NEVER)
        rows.append((mode.name, t, err, step))
    base_t, base_step = rows[0][1], rows[0][3]
    print("| mode | 1024^3 matmul | vs DEFAULT | rel. error vs f64 | train_gpt step | vs DEFAULT |")
    print("|---|---|---|---|---|---|")
    for name, t, err, step in rows:
        print(f"| {name} | {t * 1e3:.1f} ms | {t / base_t:.2f}x | {err:.2e} | {step * 1e3:.1f} ms | {step / base_step:.2f}x |")


if __name__ == "__main__":
    main()
