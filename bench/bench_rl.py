"""RL colocation (issue 27): weight-sync time and iteration time of examples/rl_colocated.py, the
trainer and vLLM on one tpu device in one process, with the weights handed to vLLM's loader as the
trainer's device tensors ("device") against a state dict copied through host memory first ("host",
what a trainer in another process without a device-to-device path does). Run with .venv-vllm:

  .venv-vllm/bin/python bench/bench_rl.py                  # tiny policy and ~107M parameters
  .venv-vllm/bin/python bench/bench_rl.py --sizes tiny     # the tiny policy only

Each (size, sync) runs in a fresh process; medians over the iterations after the first two (which
compile). Sizes: tiny = hidden 64, 2 layers (~0.1M parameters); 100m = hidden 1024, 12 layers,
vocab 64 (~107M parameters, float32). The two-process design (deliverable 2) is not built yet.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "rl_colocated.py")
SIZES = {"tiny": (["--hidden", "64", "--layers", "2"], 12), "100m": (["--hidden", "1024", "--layers", "12"], 5)}


def run(size, sync):
    flags, iters = SIZES[size]
    p = subprocess.run([sys.executable, EXAMPLE, "--json", "--sync", sync, "--iterations", str(iters), *flags],
                       capture_output=True, text=True, env=dict(os.environ, VLLM_NO_USAGE_STATS="1"))
    rows = [json.loads(ln[5:]) for ln in p.stdout.splitlines() if ln.startswith("ITER ")]
    if p.returncode or not rows:
        raise SystemExit(f"{size}/{sync} failed:\n{p.stderr[-4000:]}")
    steady = rows[2:]
    return dict(sync_ms=statistics.median(r["sync_seconds"] for r in steady) * 1e3,
                iter_s=statistics.median(r["seconds"] for r in steady),
                host_mib=statistics.median(r["sync_host_bytes"] for r in steady) / 2**20,
                gen_mib=max(r["generate_peak_bytes"] for r in steady) / 2**20,
                train_mib=max(r["train_peak_bytes"] for r in steady) / 2**20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="tiny,100m")
    args = ap.parse_args()
    print("| policy | sync | weight sync (ms) | iteration (s) | host bytes per sync (MiB) | peak generate / train (MiB) |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        res = {s: run(size, s) for s in ("device", "host")}
        for s, r in res.items():
            print(f"| {size} | {s} | {r['sync_ms']:.1f} | {r['iter_s']:.2f} | {r['host_mib']:.1f} | "
                  f"{r['gen_mib']:.0f} / {r['train_mib']:.0f} |", flush=True)
        print(f"| {size} | host / device | {res['host']['sync_ms'] / res['device']['sync_ms']:.2f}x | "
              f"{res['host']['iter_s'] / res['device']['iter_s']:.2f}x | | |", flush=True)


if __name__ == "__main__":
    main()
