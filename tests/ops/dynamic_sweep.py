"""The bounded-dynamism sweep over PyTorch's op_db, in worker processes.

  python tests/ops/dynamic_sweep.py [--samples K] [--grad] [--chunk N] [--jobs J] [--timeout S] [--emit-rules]

Runs `opinfo_parity.py --dynamic` over the entries in chunks of N per worker process
(an XLA compile that never ends, or a crash, costs one chunk: its entries are then run
one per process and the one that hangs is reported as such). Prints per entry the result
and the ATen ops it ran at a bucket; --emit-rules prints the rules that ran at a bucket in
some entry and matched CPU in every entry they ran in (csrc/lowering/dynamic_rules.cc)."""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def entries():
    code = ("from torch.testing._internal.common_methods_invocations import op_db\n"
            "for op in op_db: print(op.name + ('.' + op.variant_test_name if op.variant_test_name else ''))")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    return [l for l in out.splitlines() if l]


def run_chunk(names, args):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, os.path.join(HERE, "opinfo_parity.py"), "--dynamic", "--samples", str(args.samples),
           "--ops", ",".join(names), "--json", path] + (["--grad"] if args.grad else [])
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        with open(path) as f:
            return json.load(f)["entries"]
    except (subprocess.TimeoutExpired, json.JSONDecodeError, FileNotFoundError):
        return None
    finally:
        if os.path.exists(path):
            os.remove(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--grad", action="store_true")
    ap.add_argument("--chunk", type=int, default=40)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at once")
    ap.add_argument("--ops", default=None, help="only these entries (comma-separated)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--emit-rules", action="store_true")
    args = ap.parse_args()
    names = entries()
    if args.ops:
        want = set(args.ops.split(","))
        names = [n for n in names if n in want or n.split(".")[0] in want]
    ops = list(dict.fromkeys(names))
    def one_chunk(chunk):
        r = run_chunk(chunk, args)
        if r is None:  # a hang or a crash: one entry per process
            r = []
            for n in chunk:
                one = run_chunk([n], argparse.Namespace(**{**vars(args), "timeout": min(args.timeout, 300)}))
                r += one if one is not None else [[n, "fail", "hangs or crashes (timed out)", [], []]]
        return [e for e in r if e[0] in chunk]

    from concurrent.futures import ThreadPoolExecutor

    results = []
    chunks = [ops[i:i + args.chunk] for i in range(0, len(ops), args.chunk)]
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for r in pool.map(one_chunk, chunks):
            for e in r:
                results.append(e)
                print(f"{e[1]:7s} {e[0]} {e[2]} {' '.join(e[4] if e[1] == 'fail' else e[3])}", flush=True)
    good, bad = collections.defaultdict(set), collections.defaultdict(set)
    for name, rr, _, ops_, failing in results:
        for o in ops_:
            good[o].add(name)
        for o in failing:
            bad[o].add(name)
    clean = sorted(o for o in good if not bad[o])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"entries": results, "clean": clean, "suspects": {o: sorted(b) for o, b in bad.items()}}, f, indent=0)
    if args.emit_rules:
        for o in clean:
            print(f'      "{o}",')
    counts = collections.Counter(r[1] for r in results)
    print(dict(counts), f"{len(clean)} ops ran at a bucket and always matched; {len(bad)} suspects", file=sys.stderr)


if __name__ == "__main__":
    main()
