"""Compiled mode against everything else, side by side in one run.

  python bench/bench_compile.py                 # all sections, 3 alternating rounds
  python bench/bench_compile.py --only gpt      # (1) examples/train_gpt.py step
  python bench/bench_compile.py --only tiny128  # (2) the d=128 TinyGPT, with jax.jit
  python bench/bench_compile.py --only first    # (3) first-step time, cold compile cache
  python bench/bench_compile.py --only call     # (4) per-call overhead of a tiny compiled function

(1) examples/train_gpt.py's model and step: PyTorch CPU eager, Inductor on CPU
    (torch.compile), tpu Strict, DeferAndFuse and compiled (torch.compile of the
    model and of the optimizer step).
(2) a TinyGPT (d=128, 4 heads, 4 layers, T=64, batch 16, vocab 64, AdamW, no
    dropout) in plain torch.nn and in plain JAX (one jax.jit of loss, gradients
    and the AdamW update): the JAX program is the closest thing to what the XLA
    compiler under tpu can do with this model. JAX multiplies float32 in
    float32, so tpu is also measured at HIGHEST precision. JAX is a
    benchmark-only dependency: the JAX that the CPU plugin's wheel brings is used
    when it imports, else the script installs jax==0.10.2 into .venv-bench.
(3) the first training step (compile included) with an empty compile cache:
    compiled tpu, DeferAndFuse, Inductor, jax.jit.
(4) `x + 1` on 16 floats, compiled, called in a loop: dispatch time per call
    and time per call with the result waited for, tpu compiled vs Inductor.

Every measurement runs in its own process (so modes do not share caches or
threads); sections alternate their modes over rounds and report each mode's
best round. Results are ratios; the machine is shared and noisy.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))


# ---------------------------------------------------------------- workers (run in subprocesses)
def torch_worker(kind, mode, steps, precision):
    import torch

    device = "cpu" if mode in ("cpu", "inductor") else "tpu"
    if device == "tpu":
        import torch_tpu

        torch.tpu.set_matmul_precision(torch.tpu.Precision[precision.upper()])
        torch_tpu.set_eager_mode({"strict": torch_tpu.EagerMode.DEFER_NEVER,
                                  "fuse": torch_tpu.EagerMode.DEFER_AND_FUSE,
                                  "compiled": torch_tpu.EagerMode.DEFER_NEVER}[mode])
    import train_gpt as tg

    torch.manual_seed(0)
    if kind == "gpt":
        data = tg.CharData(tg.make_corpus(), 32, device)
        model = tg.GPT(data.vocab, block=32).to(device)
        batch, gen = 16, torch.Generator().manual_seed(0)
        next_batch = lambda: data.batch(batch, gen)  # noqa: E731
        lr = 3e-3
    else:  # tiny128
        model = tg.GPT(64, d=128, layers=4, heads=4, block=64, dropout=0.0).to(device)
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randint(0, 64, (16, 64), generator=g).to(device),
                    torch.randint(0, 64, (16, 64), generator=g).to(device)) for _ in range(4)]
        it = iter(range(10 ** 9))
        next_batch = lambda: batches[next(it) % 4]  # noqa: E731
        lr = 1e-3
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    fwd, step = model, opt.step
    if mode in ("inductor", "compiled"):
        fwd, step = torch.compile(model), torch.compile(opt.step)
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next_batch()
        _, loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    out = {"first": times[0], "steady": statistics.median(times[max(2, steps // 3):]), "loss": losses[-1]}
    if device == "tpu":
        m = torch_tpu.metrics.report()
        out["compiles"] = m["compiles"]
        out["compile_seconds"] = m["compile_seconds"]
        out["fallbacks"] = len(m["cpu_fallbacks"])
    return out


def jax_worker(steps):
    import jax
    import jax.numpy as jnp

    V, D, H, L, T, B = 64, 128, 4, 4, 64, 16
    key = jax.random.PRNGKey(0)

    def dense(k, i, o):
        return {"w": jax.random.normal(k, (i, o)) * (1 / i) ** 0.5, "b": jnp.zeros(o)}

    ks = iter(jax.random.split(key, 64))
    params = {"tok": jax.random.normal(next(ks), (V, D)), "pos": jax.random.normal(next(ks), (T, D)),
              "ln": {"g": jnp.ones(D), "b": jnp.zeros(D)}, "head": jax.random.normal(next(ks), (D, V)) * D ** -0.5,
              "blocks": [{"ln1": {"g": jnp.ones(D), "b": jnp.zeros(D)}, "qkv": dense(next(ks), D, 3 * D),
                          "proj": dense(next(ks), D, D), "ln2": {"g": jnp.ones(D), "b": jnp.zeros(D)},
                          "fc1": dense(next(ks), D, 4 * D), "fc2": dense(next(ks), 4 * D, D)} for _ in range(L)]}

    def ln(p, x):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * p["g"] + p["b"]

    def lin(p, x):
        return x @ p["w"] + p["b"]

    mask = jnp.tril(jnp.ones((T, T), bool))

    def forward(p, idx):
        x = p["tok"][idx] + p["pos"][None]
        for blk in p["blocks"]:
            h = lin(blk["qkv"], ln(blk["ln1"], x))
            q, k, v = jnp.split(h, 3, axis=-1)
            sh = lambda t: t.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)  # noqa: E731
            q, k, v = sh(q), sh(k), sh(v)
            att = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / (D // H) ** 0.5, -jnp.inf)
            y = (jax.nn.softmax(att, -1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            x = x + lin(blk["proj"], y)
            x = x + lin(blk["fc2"], jax.nn.gelu(lin(blk["fc1"], ln(blk["ln2"], x)), approximate=False))
        return ln(p["ln"], x) @ p["head"]

    def loss_fn(p, idx, tgt):
        logp = jax.nn.log_softmax(forward(p, idx), -1)
        return -jnp.take_along_axis(logp, tgt[..., None], -1).mean()

    b1, b2, eps, lr, wd = 0.9, 0.999, 1e-8, 1e-3, 0.01

    @jax.jit
    def train_step(p, m, v, t, idx, tgt):
        loss, g = jax.value_and_grad(loss_fn)(p, idx, tgt)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        p = jax.tree_util.tree_map(lambda p, m, v: p * (1 - lr * wd) - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), p, m, v)
        return p, m, v, t, loss

    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    t = jnp.zeros((), jnp.float32)
    data = [(jax.random.randint(k1, (B, T), 0, V), jax.random.randint(k2, (B, T), 0, V))
            for k1, k2 in jax.random.split(jax.random.PRNGKey(1), (4, 2))]
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        params, m, v, t, loss = train_step(params, m, v, t, *data[i % 4])
        loss = float(loss)
        times.append(time.perf_counter() - t0)
    return {"first": times[0], "steady": statistics.median(times[max(2, steps // 3):]), "loss": loss,
            "jax": jax.__version__}


def call_worker(backend, n=3000):
    import torch

    device = "cpu" if backend == "inductor" else "tpu"
    if device == "tpu":
        import torch_tpu  # noqa: F401
    f = torch.compile(lambda x: x + 1)
    x = torch.ones(16, device=device)
    for _ in range(20):
        f(x)
    sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        y = f(x)
    sync()
    dispatch = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n // 3):
        y = f(x)
        y.cpu() if device == "tpu" else y
    waited = (time.perf_counter() - t0) / (n // 3)
    return {"dispatch": dispatch, "waited": waited}


# ---------------------------------------------------------------- driver
def run(args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    py = env.pop("BENCH_PYTHON", sys.executable)
    r = subprocess.run([py, os.path.abspath(__file__), "--worker"] + args, capture_output=True, text=True, env=env,
                       timeout=1800)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def jax_python():
    """A Python that imports jax: ours (the CPU plugin's wheel depends on jax), else .venv-bench."""
    if subprocess.run([sys.executable, "-c", "import jax"], capture_output=True).returncode == 0:
        return sys.executable
    venv = os.path.join(ROOT, ".venv-bench")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "jax==0.10.2"], check=True)
    return py


def rounds(modes, rounds_n, fn):
    best = {}
    for r in range(rounds_n):
        order = modes if r % 2 == 0 else list(reversed(modes))
        for m in order:
            res = fn(m)
            if "error" in res:
                best.setdefault(m, res)
                continue
            if m not in best or "error" in best[m] or res["steady"] < best[m]["steady"]:
                best[m] = res
    return best


def fmt(ms):
    return f"{ms * 1000:.1f} ms"


def section_gpt(n_rounds, steps):
    cache = tempfile.mkdtemp()
    modes = ["cpu", "inductor", "strict", "fuse", "compiled"]
    best = rounds(modes, n_rounds, lambda m: run(["torch", "gpt", m, str(steps), "default"],
                                                 {"TORCH_TPU_CACHE_DIR": cache}))
    print("\n(1) examples/train_gpt.py step (batch 16 x 32 tokens, d=64, 2 layers, dropout 0.1), best of "
          f"{n_rounds} rounds, median of steps {steps // 3}..{steps}")
    print("| mode | step | compiled is ... | final loss |\n|---|---|---|---|")
    c = best["compiled"].get("steady")
    for m in modes:
        b = best[m]
        if "error" in b:
            print(f"| {m} | error: {b['error']} | | |")
            continue
        ratio = "" if m == "compiled" or not c else f"{b['steady'] / c:.2f}x faster"
        print(f"| {m} | {fmt(b['steady'])} | {ratio} | {b['loss']:.3f} |")
    return best


def section_tiny128(n_rounds, steps):
    cache = tempfile.mkdtemp()
    modes = ["cpu", "inductor", "fuse:default", "fuse:highest", "compiled:default", "compiled:highest", "jax"]
    jpy = jax_python()

    def one(m):
        if m == "jax":
            return run(["jax", str(steps)], {"BENCH_PYTHON": jpy})
        mode, prec = (m.split(":") + ["default"])[:2]
        return run(["torch", "tiny128", mode, str(steps), prec], {"TORCH_TPU_CACHE_DIR": cache})

    best = rounds(modes, n_rounds, one)
    print(f"\n(2) TinyGPT d=128, 4 heads, 4 layers, T=64, batch 16, vocab 64, AdamW: step time, best of {n_rounds} rounds")
    print("| mode | step | compiled (same precision) is ... |\n|---|---|---|")
    for m in modes:
        b = best[m]
        if "error" in b:
            print(f"| {m} | error: {b['error']} | |")
            continue
        prec = "highest" if m in ("jax", "cpu", "inductor") or m.endswith("highest") else "default"
        c = best.get(f"compiled:{prec}", {}).get("steady")
        ratio = "" if m.startswith("compiled") or not c else f"{b['steady'] / c:.2f}x faster"
        extra = f" (jax {b['jax']})" if m == "jax" else ""
        print(f"| {m}{extra} | {fmt(b['steady'])} | {ratio} |")
    return best


def section_first():
    jpy = jax_python()
    res = {}
    for m in ["compiled", "fuse", "inductor"]:
        res[m] = run(["torch", "tiny128", m, "3", "default"],
                     {"TORCH_TPU_CACHE_DIR": tempfile.mkdtemp(), "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp()})
    res["compiled, warm restart"] = run(["torch", "tiny128", "compiled", "3", "default"],
                                        {"TORCH_TPU_CACHE_DIR": _warm_cache()})
    res["jax"] = run(["jax", "3"], {"BENCH_PYTHON": jpy})
    print("\n(3) first training step of the d=128 TinyGPT (trace and compile included), empty compile cache")
    print("| mode | first step | of which XLA compiles (count) |\n|---|---|---|")
    for m, b in res.items():
        if "error" in b:
            print(f"| {m} | error: {b['error']} | |")
            continue
        xla = f"{b['compile_seconds']:.2f} s ({b['compiles']})" if "compiles" in b else ""
        print(f"| {m} | {b['first']:.2f} s | {xla} |")
    return res


_WARM = None


def _warm_cache():
    """A compile cache that a first compiled run has filled (the second run is a warm restart)."""
    global _WARM
    if _WARM is None:
        _WARM = tempfile.mkdtemp()
        run(["torch", "tiny128", "compiled", "3", "default"], {"TORCH_TPU_CACHE_DIR": _WARM})
    return _WARM


def section_call(n_rounds):
    res = {}
    for r in range(n_rounds):
        for b in ["tpu", "inductor"]:
            x = run(["call", b])
            if "error" in x:
                res.setdefault(b, x)
            elif b not in res or "error" in res[b] or x["dispatch"] < res[b]["dispatch"]:
                res[b] = x
    print("\n(4) per call of torch.compile(lambda x: x + 1) on 16 float32 values")
    print("| backend | dispatch per call | call + wait for the result |\n|---|---|---|")
    for b, x in res.items():
        if "error" in x:
            print(f"| {b} | error: {x['error']} | |")
            continue
        print(f"| {b} | {x['dispatch'] * 1e6:.1f} us | {x['waited'] * 1e6:.1f} us |")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs="+")
    ap.add_argument("--only", choices=["gpt", "tiny128", "first", "call"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=45)
    a = ap.parse_args()
    if a.worker:
        w = a.worker
        if w[0] == "torch":
            out = torch_worker(w[1], w[2], int(w[3]), w[4])
        elif w[0] == "jax":
            out = jax_worker(int(w[1]))
        else:
            out = call_worker(w[1])
        print(json.dumps(out))
        return
    print(f"bench_compile: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs")
    if a.only in (None, "gpt"):
        section_gpt(a.rounds, a.steps)
    if a.only in (None, "tiny128"):
        section_tiny128(a.rounds, max(12, a.steps // 3))
    if a.only in (None, "first"):
        section_first()
    if a.only in (None, "call"):
        section_call(a.rounds)


if __name__ == "__main__":
    main()
