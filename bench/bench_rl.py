"""RL colocation (issue 27): weight-sync time and iteration time of examples/rl_colocated.py, the
trainer and vLLM on one tpu device, in one process or in two processes attached to a device owner
(`--processes 2`), with the weights handed over as the trainer's device tensors ("device": to
vLLM's loader as they are in one process, by `torch_tpu.owner.share` handle across processes)
against a state dict copied through host memory ("host": what a trainer without a device-to-device
path does, pickled to the other process when there are two). Run with .venv-vllm:

  .venv-vllm/bin/python bench/bench_rl.py                  # tiny policy and ~107M parameters
  .venv-vllm/bin/python bench/bench_rl.py --sizes tiny     # the tiny policy only

Each (size, sync) runs in a fresh process; medians over the iterations after the first two (which
compile). Sizes: tiny = hidden 64, 2 layers (~0.1M parameters); 100m = hidden 1024, 12 layers,
vocab 64 (~107M parameters, float32).
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


def run(size, processes, sync):
    flags, iters = SIZES[size]
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1")
    env.pop("TORCH_TPU_OWNER", None)  # --processes 2 starts an owner of its own
    p = subprocess.run([sys.executable, EXAMPLE, "--json", "--sync", sync, "--iterations", str(iters),
                        "--processes", str(processes), *flags], capture_output=True, text=True, env=env)
    rows = [json.loads(ln[5:]) for ln in p.stdout.splitlines() if ln.startswith("ITER ")]
    if p.returncode or not rows:
        raise SystemExit(f"{size}/{processes}/{sync} failed:\n{p.stderr[-4000:]}")
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
    print("| policy | processes | sync | weight sync (ms) | iteration (s) | host bytes per sync (MiB) | "
          "peak generate / train (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        res = {}
        for key in ((1, "device"), (1, "host"), (2, "device"), (2, "host")):
            r = res[key] = run(size, *key)
            print(f"| {size} | {key[0]} | {key[1]} | {r['sync_ms']:.1f} | {r['iter_s']:.2f} | {r['host_mib']:.1f} | "
                  f"{r['gen_mib']:.0f} / {r['train_mib']:.0f} |", flush=True)
        base = res[(1, "device")]
        for key in ((1, "host"), (2, "device"), (2, "host")):
            print(f"| {size} | {key[0]} {key[1]} / 1 device | | | {res[key]['sync_ms'] / base['sync_ms']:.2f}x | "
                  f"{res[key]['iter_s'] / base['iter_s']:.2f}x | | |", flush=True)

if __name__ == "__main__":
    main()
