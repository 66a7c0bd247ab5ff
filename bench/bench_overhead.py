"""Host overhead on tpu against PyTorch CPU (and Inductor), side by side in one run.

  python bench/bench_overhead.py                 # both parts
  python bench/bench_overhead.py --only latency  # (a) per-op and host-read latency
  python bench/bench_overhead.py --only decode   # (b) HF tiny Llama greedy decode, per token
  python bench/bench_overhead.py --only stages   # (c) a Strict op's time per stage of the kernel
  python bench/bench_overhead.py --only slices   # (d) an in-place op on a slice vs the whole tensor
  python bench/bench_overhead.py --only sdpa     # (e) scaled_dot_product_attention at decode shapes

(a) a cached 1k-element add in Strict mode; host reads of 16 floats (`.cpu()`, `(x + 1).cpu()`,
    `x[0].item()`, `.tolist()`); `torch.compile(lambda x: x + 1)` calls, with and without
    `.cpu()`; each next to the same code on PyTorch CPU (eager, and Inductor for the compiled
    rows). Best of 5 repetitions, microseconds per call.
(b) HF tiny Llama (vocab 256, hidden 64, 2 layers) `generate(max_new_tokens=32)` from an
    8-token prompt, warm (third call), in Strict, DeferAndFuse and compiled (`torch.compile`d
    forward, `cache_implementation="static"`): seconds per new token on tpu and on PyTorch CPU
    eager (dynamic cache); each mode in a fresh process.
(c) the cached 1k-element add in Strict mode under TORCH_TPU_STAGE_TIMES=1 (a fresh process):
    microseconds per op in each stage of the generic kernel (csrc/aten/dispatch/kernels.cpp, LoweredOp),
    and the rest of the op's time (the dispatcher, Python, the clock itself).
(d) `c[1].add_(1)` (a slice updated in place) against `c.add_(1)` (the whole 256 MB float32
    tensor) for c of shapes (32, 2M), (8, 8M), (2, 32M) and a 5-D KV cache (8, 2048, 2, 8, 256),
    Strict, milliseconds per op (mean of 20 after a warm-up); each shape in a fresh process with
    TORCH_TPU_DYNAMIC=0 (one slice size per line of Python: the size policy would bucket it).
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap
import time


def per_call_us(fn, sync, n=2000, reps=5):
    for _ in range(100):
        fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def latency():
    import torch
    import torch_tpu  # noqa: F401

    tsync = torch.tpu.synchronize

    def nosync():
        pass

    rows = []
    a, b = torch.randn(1024), torch.randn(1024)
    ta, tb = a.to("tpu"), b.to("tpu")
    rows.append(("cached 1k-element add, Strict", per_call_us(lambda: ta + tb, tsync), per_call_us(lambda: a + b, nosync)))
    s = torch.randn(16)
    ts = s.to("tpu")
    rows.append(("`x.cpu()`, 16 floats", per_call_us(lambda: ts.cpu(), nosync), per_call_us(lambda: s.clone(), nosync)))
    rows.append(("`(x + 1).cpu()`, 16 floats", per_call_us(lambda: (ts + 1).cpu(), nosync),
                 per_call_us(lambda: (s + 1).clone(), nosync)))
    rows.append(("`x[0].item()`", per_call_us(lambda: ts[0].item(), nosync), per_call_us(lambda: s[0].item(), nosync)))
    rows.append(("`x.tolist()`, 16 floats", per_call_us(lambda: ts.tolist(), nosync), per_call_us(lambda: s.tolist(), nosync)))
    rows.append(("`x.sum().item()`, 16 floats", per_call_us(lambda: ts.sum().item(), nosync),
                 per_call_us(lambda: s.sum().item(), nosync)))
    f_tpu = torch.compile(lambda x: x + 1)
    f_cpu = torch.compile(lambda x: x + 1)
    rows.append(("`torch.compile(lambda x: x + 1)` call, 16 floats (CPU: Inductor)",
                 per_call_us(lambda: f_tpu(ts), tsync, n=1000), per_call_us(lambda: f_cpu(s), nosync, n=1000)))
    rows.append(("the same with `.cpu()` (CPU: Inductor + clone)",
                 per_call_us(lambda: f_tpu(ts).cpu(), nosync, n=1000), per_call_us(lambda: f_cpu(s).clone(), nosync, n=1000)))
    print("## (a) per-op and host-read latency, us per call (best of 5)\n")
    print(f"device: {torch.tpu.get_device_name()}, torch {torch.__version__}\n")
    print("| measure | tpu us | PyTorch CPU us | tpu / CPU |\n|---|---|---|---|")
    for name, t, c in rows:
        print(f"| {name} | {t:.1f} | {c:.1f} | {t / c:.1f}x |")
    print()


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dynamic import LLAMA  # noqa: E402  the same tiny Llama on CPU and on tpu

DECODE = LLAMA + r"""
torch.tpu.set_matmul_precision(torch.tpu.Precision.HIGHEST)
mode = "%(mode)s"
ids = torch.randint(2, 256, (1, 8), generator=torch.Generator().manual_seed(8))
kw = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)
tpu_kw = dict(kw)
if mode == "compiled":  # a compiled forward over a static KV cache, as transformers documents it
    tpu.forward = torch.compile(tpu.forward)
    tpu_kw["cache_implementation"] = "static"
else:
    torch_tpu.set_eager_mode(getattr(torch_tpu.EagerMode, mode))
def gen(m, dev):
    t0 = time.perf_counter()
    with torch.no_grad():
        out = m.generate(input_ids=ids.to(dev), attention_mask=torch.ones_like(ids).to(dev),
                         **(tpu_kw if dev == "tpu" else kw)).cpu()
    return out, time.perf_counter() - t0
for _ in range(2):
    gen(tpu, "tpu"); gen(cpu, "cpu")
c0 = torch_tpu.metrics.report()["compiles"]
t_out, t = min((gen(tpu, "tpu") for _ in range(3)), key=lambda r: r[1])
c_out, c = min((gen(cpu, "cpu") for _ in range(3)), key=lambda r: r[1])
print(json.dumps(dict(tpu=t / 32, cpu=c / 32, equal=bool(torch.equal(t_out, c_out)),
                      compiles=torch_tpu.metrics.report()["compiles"] - c0)))
"""


def decode():
    print("## (b) HF tiny Llama greedy decode, 32 new tokens, warm, ms per token\n")
    print("| mode | tpu ms/token | PyTorch CPU ms/token | tpu / CPU | compiles (warm calls) | tokens equal CPU |")
    print("|---|---|---|---|---|---|")
    for mode in ("DEFER_NEVER", "DEFER_AND_FUSE", "compiled"):
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(DECODE % {"mode": mode})], capture_output=True,
                             text=True)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-4000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {mode} | {1e3 * r['tpu']:.2f} | {1e3 * r['cpu']:.2f} | {r['tpu'] / r['cpu']:.1f}x | "
              f"{r['compiles']} | {r['equal']} |")
    print()


STAGES = r"""
import json, time, torch, torch_tpu
a, b = torch.randn(1024, device="tpu"), torch.randn(1024, device="tpu")
best = None
for _ in range(5):
    for _ in range(200):
        a + b
    torch.tpu.synchronize()
    torch_tpu._C._stage_times(True)
    t0 = time.perf_counter()
    for _ in range(2000):
        a + b
    torch.tpu.synchronize()
    wall = (time.perf_counter() - t0) / 2000 * 1e9
    st = torch_tpu._C._stage_times(False)
    if best is None or wall < best[0]:
        best = (wall, {k: ns / max(calls, 1) for k, (calls, ns) in st.items()})
print(json.dumps(dict(wall=best[0], stages=best[1])))
"""


def stages():
    env = dict(os.environ, TORCH_TPU_STAGE_TIMES="1")
    out = subprocess.run([sys.executable, "-c", STAGES], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-4000:])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print("## (c) cached 1k-element add, Strict: us per op in each stage (best of 5 x 2000 ops)\n")
    print("| stage | us per op |\n|---|---|")
    for k, ns in r["stages"].items():
        print(f"| {k} | {ns / 1e3:.2f} |")
    inside = sum(r["stages"].values())
    print(f"| (outside the kernel: dispatcher, Python) | {(r['wall'] - inside) / 1e3:.2f} |")
    print(f"| **per op, wall** | **{r['wall'] / 1e3:.2f}** |\n")


SLICES = textwrap.dedent("""
    import sys, time, torch, torch_tpu
    shape = tuple(int(v) for v in sys.argv[1].split(","))
    c = torch.zeros(*shape, device="tpu")
    out = []
    for f in (lambda: c[1].add_(1), lambda: c.add_(1)):
        f(); torch.tpu.synchronize()
        t = time.perf_counter()
        for _ in range(20): f()
        torch.tpu.synchronize()
        out.append((time.perf_counter() - t) / 20 * 1e3)
    print(*out)
""")


def slices():
    print("## (d) in-place add on a slice vs the whole tensor (256 MB float32), Strict, ms per op\n")
    print("| shape | slice `c[1]` MB | `c[1].add_(1)` ms | `c.add_(1)` ms |\n|---|---|---|---|")
    env = dict(os.environ, TORCH_TPU_DYNAMIC="0")
    for shape in [(32, 2 ** 21), (8, 2 ** 23), (2, 2 ** 25), (8, 2048, 2, 8, 256)]:
        arg = ",".join(map(str, shape))
        out = subprocess.run([sys.executable, "-c", SLICES, arg], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise SystemExit(out.stderr[-4000:])
        part, whole = map(float, out.stdout.split())
        mb = 4 * (2 ** 26 // shape[0]) / 2 ** 20
        print(f"| {shape} | {mb:.0f} | {part:.2f} | {whole:.2f} |")
    print()


def sdpa():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import torch_tpu

    torch.tpu.set_matmul_precision(torch.tpu.Precision.HIGHEST)
    torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*s, generator=g).to("tpu") for s in ((64, 4, 2, 64), (64, 4, 512, 64), (64, 4, 512, 64)))
    mask = (torch.rand(64, 1, 2, 512, generator=g) > 0.2).to("tpu")

    def math():
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def written_out():
        s = (q @ k.transpose(-1, -2)) * 64 ** -0.5
        return s.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    rows = [("fused backend (the default)", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
            ("math path (`sdpa_kernel(SDPBackend.MATH)`)", math), ("matmul + softmax written out", written_out)]
    print("## (e) scaled_dot_product_attention at decode shapes, DeferAndFuse, ms per 4 calls (best of 5)\n")
    print("q [64, 4, 2, 64], keys and values [64, 4, 512, 64], boolean mask [64, 1, 2, 512]\n")
    print("| path | ms |\n|---|---|")
    for name, f in rows:
        for _ in range(3):
            sum(f().sum() for _ in range(4)).item()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            sum(f().sum() for _ in range(4)).item()
            best = min(best, time.perf_counter() - t)
        print(f"| {name} | {best * 1e3:.1f} |")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["latency", "decode", "stages", "slices", "sdpa"])
    args = ap.parse_args()
    if args.only in (None, "latency"):
        latency()
    if args.only in (None, "decode"):
        decode()
    if args.only in (None, "stages"):
        stages()
    if args.only in (None, "slices"):
        slices()
    if args.only in (None, "sdpa"):
        sdpa()


if __name__ == "__main__":
    main()
