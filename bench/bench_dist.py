"""torch.distributed on tpu: all-reduce bandwidth of the tpu_dist backend against gloo on
CPU tensors (1 KiB - 64 MiB, 2 ranks), and the DDP step time of examples/train_ddp.py
with 2 ranks against 1.

  python bench/bench_dist.py [--iters 20] [--ddp-steps 30]

It launches itself with torchrun (2 ranks); the tpu_dist runs are made with the per-call
agreement check on (default) and off (TORCH_TPU_DIST_CHECKS=0).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB


def worker(iters):
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.tpu.set_device(local)
    dist.init_process_group()
    out = {}
    for nbytes in SIZES:
        n = nbytes // 4
        for dev in ("cpu", f"tpu:{local}"):
            t = torch.ones(n, device=dev)
            for _ in range(3):  # warm up (connections, programs)
                dist.all_reduce(t)
            if dev != "cpu":
                torch.tpu.synchronize()
            k = max(3, min(iters, int(iters * (1 << 20) / nbytes) or 3))
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(t)
            if dev != "cpu":
                t.cpu()  # the last write-back has landed
            dt = (time.perf_counter() - t0) / k
            out[f"{nbytes}/{dev.split(':')[0]}"] = dt
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def torchrun(nproc, args, env=None):
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("TORCH_TPU_NUM_DEVICES", None)
    e.update(env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise RuntimeError(p.stdout[-3000:] + p.stderr[-3000:])
    return p.stdout


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ddp-steps", type=int, default=30)
    ap.add_argument("--worker", action="store_true")
    a = ap.parse_args()
    if a.worker:
        return worker(a.iters)
    me = os.path.abspath(__file__)
    runs = {}
    for checks in ("1", "0"):
        out = torchrun(2, [me, "--worker", "--iters", str(a.iters)], {"TORCH_TPU_DIST_CHECKS": checks})
        runs[checks] = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    print("all_reduce (SUM, float32), 2 ranks, seconds per call -> algorithm bandwidth (size / time)")
    print("| size | gloo, cpu tensors | tpu_dist | tpu_dist, no agreement check | tpu / gloo time |")
    print("|---|---|---|---|---|")
    for nbytes in SIZES:
        g, t, t0 = runs["1"][f"{nbytes}/cpu"], runs["1"][f"{nbytes}/tpu"], runs["0"][f"{nbytes}/tpu"]

        def cell(s):
            return f"{s * 1e6:.0f} us ({nbytes / s / 1e9:.2f} GB/s)"

        print(f"| {human(nbytes)} | {cell(g)} | {cell(t)} | {cell(t0)} | {t / g:.2f} |")
    ddp = os.path.join(ROOT, "examples", "train_ddp.py")
    steps = {}
    for nproc in (1, 2):
        out = torchrun(nproc, [ddp, "--steps", str(a.ddp_steps)])
        line = [x for x in out.splitlines() if "steady step" in x][0]
        steps[nproc] = float(line.split("steady step")[1].split("ms")[0])
    print(f"\nDDP, examples/train_ddp.py (global batch 16, {a.ddp_steps} steps, steady half): "
          f"1 rank {steps[1]:.1f} ms/step, 2 ranks {steps[2]:.1f} ms/step ({steps[2] / steps[1]:.2f}x)")


if __name__ == "__main__":
    main()
