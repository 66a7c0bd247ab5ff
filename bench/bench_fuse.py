"""DeferAndFuse against Strict, side by side in one run.

  python bench/bench_fuse.py

(1) a chain of 20 elementwise ops on a 1M-element tensor; (2) train_gpt step
time; (3) first-step time with a cold vs a warm disk compile cache (separate
processes); (4) peak tpu memory of a train_gpt run in each mode; (5) the
trace cache: train_gpt step and a 200-op loop body with repeated-sequence
detection on vs off (off: every op is lowered to program text and the flush
looks the text up), in both modes.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_eager import gpt_steps  # noqa: E402


def chain(mode, reps=10):
    import torch_tpu

    x = torch.randn(1 << 20, device="tpu")
    with torch_tpu.eager_mode(mode):
        def run():
            y = x
            for i in range(10):
                y = y * 1.01
                y = y + 0.5
            return y.sum().item()
        run(); run()  # compile
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def loop_body(mode, reps=15):
    import torch_tpu

    x = torch.randn(64, 64, device="tpu")
    w = torch.randn(64, 64, device="tpu")
    with torch_tpu.eager_mode(mode):
        def run():
            y = x
            for _ in range(50):
                y = torch.tanh(y @ w) * 0.5 + y
            return y.sum().item()
        run(); run()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


FIRST_STEP = r"""
import sys, time, torch, torch_tpu
sys.path.insert(0, sys.argv[1])
import train_gpt as tg
torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)
torch.manual_seed(0)
data = tg.CharData(tg.make_corpus(), 32, "tpu")
model = tg.GPT(data.vocab).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
gen = torch.Generator().manual_seed(0)
t0 = time.perf_counter()
for _ in range(3):
    x, y = data.batch(16, gen); _, loss = model(x, y); opt.zero_grad(); loss.backward(); opt.step(); loss.item()
print("FIRST", time.perf_counter() - t0, torch_tpu.metrics.compiles, torch.tpu.max_memory_allocated())
"""


def first_steps(cache_dir):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache_dir)
    ex = os.path.join(os.path.dirname(__file__), "..", "examples")
    out = subprocess.run([sys.executable, "-c", FIRST_STEP, ex], capture_output=True, text=True, env=env, check=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("FIRST")][0].split()
    return float(line[1]), int(line[2]), int(line[3])


def main():
    import torch_tpu

    E = torch_tpu.EagerMode
    print(f"tpu runs on: {torch.tpu.get_device_name()}")
    s, f = chain(E.DEFER_NEVER), chain(E.DEFER_AND_FUSE)
    print(f"(1) 20-op elementwise chain, 1M f32: Strict {s * 1e3:.1f} ms, DeferAndFuse {f * 1e3:.1f} ms, "
          f"speed-up {s / f:.1f}x")
    # alternating rounds (the machine is shared and noisy); best round of each mode
    st, ft = [], []
    for _ in range(3):
        torch.tpu.reset_peak_memory_stats()
        st.append(gpt_steps("tpu", 20, E.DEFER_NEVER)[0])
        peak_s = torch.tpu.memory_stats()["buffer_bytes.all.peak"]
        torch.tpu.reset_peak_memory_stats()
        ft.append(gpt_steps("tpu", 20, E.DEFER_AND_FUSE)[0])
        peak_f = torch.tpu.memory_stats()["buffer_bytes.all.peak"]
    st, ft = min(st), min(ft)
    print(f"(2) train_gpt step (best of 3 alternating rounds): Strict {st * 1e3:.1f} ms, DeferAndFuse {ft * 1e3:.1f} ms, "
          f"speed-up {st / ft:.2f}x")
    with tempfile.TemporaryDirectory() as d:
        cold, cold_compiles, _ = first_steps(d)
        warm, warm_compiles, _ = first_steps(d)
    print(f"(3) first 3 train_gpt steps, DeferAndFuse: cold disk cache {cold:.2f} s ({cold_compiles} compiles), "
          f"warm {warm:.2f} s ({warm_compiles} compiles), {cold / warm:.1f}x")
    torch_tpu._C._set_fuse_split_threads(False)
    torch.tpu.reset_peak_memory_stats()
    one_graph = gpt_steps("tpu", 20, E.DEFER_AND_FUSE)[0]
    peak_1 = torch.tpu.memory_stats()["buffer_bytes.all.peak"]
    torch_tpu._C._set_fuse_split_threads(True)
    print(f"(4) peak device-buffer bytes over the train_gpt run: Strict {peak_s / 2**20:.1f} MiB, "
          f"DeferAndFuse {peak_f / 2**20:.1f} MiB; with TORCH_TPU_FUSE_ACROSS_THREADS=1 (one graph per step, "
          f"no overlap) {peak_1 / 2**20:.1f} MiB at {one_graph * 1e3:.1f} ms per step")
    for name, mode in (("DeferAndFuse", E.DEFER_AND_FUSE), ("Strict", E.DEFER_NEVER)):
        res = {}
        for on in (True, False, True):  # on twice (first and last) to expose drift of the machine
            torch_tpu._C._set_tracing(on, False)
            g, _ = gpt_steps("tpu", 20, mode)
            res.setdefault(on, []).append((g, loop_body(mode)))
        torch_tpu._C._set_tracing(True, False)
        g_on = min(r[0] for r in res[True]); l_on = min(r[1] for r in res[True])
        g_off, l_off = res[False][0]
        print(f"(5) trace cache, {name}: train_gpt step {g_off * 1e3:.1f} ms off vs {g_on * 1e3:.1f} ms on "
              f"({g_off / g_on:.2f}x); 200-op 64x64 loop body {l_off * 1e3:.2f} ms off vs {l_on * 1e3:.2f} ms on "
              f"({l_off / l_on:.2f}x)")


if __name__ == "__main__":
    main()
