"""Cost of the device-side checks (out-of-range indices, targets, ...) on a
train_gpt step: TORCH_TPU_DEVICE_CHECKS=1 (default) against =0, side by side,
in DeferAndFuse and compiled mode, alternating rounds, each run in its own process.

  python bench/bench_checks.py [--rounds 3] [--steps 45]
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compile import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=45)
    a = ap.parse_args()
    cache = tempfile.mkdtemp()
    best = {}
    for r in range(a.rounds):
        for mode in ("fuse", "compiled"):
            for checks in (("1", "0") if r % 2 == 0 else ("0", "1")):
                res = run(["torch", "gpt", mode, str(a.steps), "default"],
                          {"TORCH_TPU_CACHE_DIR": cache, "TORCH_TPU_DEVICE_CHECKS": checks})
                key = (mode, checks)
                if "error" in res:
                    print(key, res)
                    continue
                if key not in best or res["steady"] < best[key]["steady"]:
                    best[key] = res
    print(f"train_gpt step, device checks on vs off, best of {a.rounds} rounds")
    print("| mode | checks on | checks off | on / off |\n|---|---|---|---|")
    for mode in ("fuse", "compiled"):
        on, off = best.get((mode, "1")), best.get((mode, "0"))
        if on and off:
            print(f"| {mode} | {on['steady'] * 1000:.2f} ms | {off['steady'] * 1000:.2f} ms | "
                  f"{on['steady'] / off['steady']:.3f} |")


if __name__ == "__main__":
    main()
