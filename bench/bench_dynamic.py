"""Bounded dynamism benchmarks (torch_tpu.dynamic), each part in a fresh process (the size
policy and the compile caches start cold; no disk cache):

  python bench/bench_dynamic.py                  # every part
  python bench/bench_dynamic.py --only generate  # (a)
  python bench/bench_dynamic.py --only train     # (b)
  python bench/bench_dynamic.py --only compiled  # (c)
  python bench/bench_dynamic.py --only compile-cost  # (d)
  python bench/bench_dynamic.py --only steady    # (e)
  python bench/bench_dynamic.py --only padded    # (f)

(a) HF tiny LlamaForCausalLM (vocab 256, hidden 64, 2 layers, 4 heads / 2 KV heads, random
    weights) `generate(max_new_tokens=24)` with the default dynamic KV cache, greedy, for 10
    prompt lengths 5..60, in Strict and DeferAndFuse: compiles and seconds per call, against
    PyTorch CPU eager's seconds for the same call (measured right after it, same process); the
    tokens are compared with CPU's (HIGHEST precision).
(b) examples/train_gpt.py's GPT (d=64, 2 layers, block 256) trained with AdamW for 30 batches of
    8 sequences of random lengths 16..256 in DeferAndFuse, against the same loop at a fixed
    length (the largest bucket, 256): total compiles, and the median step time of the last 10
    steps against the fixed run's.
(c) the same GPT under torch.compile(dynamic=True) (forward only, no grad) over 12 sequence
    lengths 16..256: compiles per bucket touched.
(d) what one compile costs on this plugin by program size: DeferAndFuse programs of k chained
    elementwise ops on a [64, 64] tensor (k = 1, 10, 100, 1000), and the same at a bucket
    (a dynamic dim: the dynamic padder's passes), seconds per compile.
(e) (a)'s model in the steady state: after prompts of 5 and 9 tokens, 5 calls with a prompt of
    23, bucketed (the default) against the same at fixed shapes (TORCH_TPU_DYNAMIC=0, every
    program cached): seconds per call, ops dispatched per call, and CPU eager's seconds.
(f) padded batches as users write them (no torch_tpu call in the loop), in Strict and
    DeferAndFuse: an nn.TransformerEncoder (d 32, 2 layers, feed-forward 64) trained with AdamW
    on batches of 6 sequences padded to the longest of random lengths 3..69 with a
    src_key_padding_mask, 12 steps, against the same at a fixed length 69 (total compiles,
    losses against CPU's); and (a)'s model generating 12 tokens for batches of 3 left-padded
    prompts (lengths L, L - 4, L / 2 with an attention_mask) for 10 values of L: compiles per
    call, tokens against CPU's.
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (a) and (e): the tiny Llama on CPU and on tpu, the same weights
LLAMA = r"""
import json, time, torch, torch_tpu
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  pad_token_id=0, bos_token_id=1, eos_token_id=None, tie_word_embeddings=False)
torch.manual_seed(0)
cpu = LlamaForCausalLM(cfg).eval()
tpu = LlamaForCausalLM(cfg).eval(); tpu.load_state_dict(cpu.state_dict()); tpu = tpu.to("tpu")
"""

GENERATE = LLAMA + r"""
torch.tpu.set_matmul_precision(torch.tpu.Precision.HIGHEST)
torch_tpu.set_eager_mode(torch_tpu.EagerMode.%(mode)s)
rows = []
for L in (5, 9, 13, 17, 23, 31, 40, 47, 55, 60):
    ids = torch.randint(2, 256, (1, L), generator=torch.Generator().manual_seed(L))
    kw = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    c0 = torch_tpu.metrics.report()["compiles"]; t0 = time.perf_counter()
    with torch.no_grad():
        out = tpu.generate(input_ids=ids.to("tpu"), attention_mask=torch.ones_like(ids).to("tpu"), **kw).cpu()
    t1 = time.perf_counter()
    with torch.no_grad():
        ref = cpu.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    t2 = time.perf_counter()
    rows.append(dict(L=L, compiles=torch_tpu.metrics.report()["compiles"] - c0, tpu=t1 - t0, cpu=t2 - t1,
                     equal=bool(torch.equal(out, ref))))
print(json.dumps(rows))
"""

TRAIN = r"""
import json, random, sys, time, torch, torch_tpu
sys.path.insert(0, %(examples)r)
from train_gpt import GPT
torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)
def run(lengths):
    torch.manual_seed(0)
    m = GPT(64, d=64, layers=2, heads=4, block=256, dropout=0.0).to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    c0 = torch_tpu.metrics.report()["compiles"]; times = []
    for T in lengths:
        x = torch.randint(0, 64, (8, T), generator=g); y = torch.randint(0, 64, (8, T), generator=g)
        t0 = time.perf_counter()
        _, loss = m(x.to("tpu"), y.to("tpu"))
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); loss.item()
        times.append(time.perf_counter() - t0)
    return torch_tpu.metrics.report()["compiles"] - c0, sorted(times[-10:])[5]
rng = random.Random(0)
lengths = [rng.randrange(16, 257) for _ in range(30)]
fixed = run([256] * 30)
varied = run(lengths)
print(json.dumps(dict(fixed_compiles=fixed[0], fixed_step=fixed[1], varied_compiles=varied[0], varied_step=varied[1],
                      lengths=lengths)))
"""

COMPILED = r"""
import json, sys, torch, torch_tpu
sys.path.insert(0, %(examples)r)
from train_gpt import GPT
torch.manual_seed(0)
torch.tpu.set_matmul_precision(torch.tpu.Precision.HIGHEST)  # compared with CPU below
m = GPT(64, d=64, layers=2, heads=4, block=256, dropout=0.0).to("tpu").eval()
f = torch.compile(m, dynamic=True)
per_bucket = {}
for T in (16, 20, 31, 40, 64, 77, 100, 128, 150, 200, 230, 256):
    x = torch.randint(0, 64, (4, T), generator=torch.Generator().manual_seed(T))
    xt = x.to("tpu")
    c0 = torch_tpu.metrics.report()["compiles"]
    with torch.no_grad():
        logits, _ = f(xt)
        logits = logits.cpu()
    n = torch_tpu.metrics.report()["compiles"] - c0  # the compiled call's programs only
    with torch.no_grad():
        ref, _ = m.cpu()(x)
        m.to("tpu")
    torch.testing.assert_close(logits, ref, rtol=2e-3, atol=2e-3)
    b = torch_tpu.dynamic.bucket(T)
    per_bucket[b] = per_bucket.get(b, 0) + n
print(json.dumps(per_bucket))
"""


COMPILE_COST = r"""
import json, time, torch, torch_tpu
torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)
rows = []
for dynamic in (False, True):
    for k in (1, 10, 100, 1000):
        x = torch.randn(64, 64 if not dynamic else 60).to("tpu")
        if dynamic:
            torch_tpu.mark_dynamic(x, 1)
        y = x
        for i in range(k):
            y = torch.tanh(y * (1 + i * 1e-4)) + 0.5
        m0 = torch_tpu.metrics.report()
        y.sum().cpu()
        m1 = torch_tpu.metrics.report()
        n = m1["compiles"] - m0["compiles"]
        rows.append(dict(k=k, dynamic=dynamic, compiles=n, seconds=(m1["compile_seconds"] - m0["compile_seconds"]) / max(n, 1),
                         bytes=(m1["program_bytes"] - m0["program_bytes"])))
print(json.dumps(rows))
"""

STEADY = LLAMA + r"""
torch_tpu.set_eager_mode(torch_tpu.EagerMode.%(mode)s)
kw = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
def gen(m, L, dev):
    ids = torch.randint(2, 256, (1, L), generator=torch.Generator().manual_seed(L))
    with torch.no_grad():
        m.generate(input_ids=ids.to(dev), attention_mask=torch.ones_like(ids).to(dev), **kw).cpu()
for L in (5, 9, 23):
    gen(tpu, L, "tpu")
m0 = torch_tpu.metrics.report(); t0 = time.perf_counter()
for _ in range(5):
    gen(tpu, 23, "tpu")
t1 = time.perf_counter(); m1 = torch_tpu.metrics.report()
for _ in range(5):
    gen(cpu, 23, "cpu")
t2 = time.perf_counter()
print(json.dumps(dict(tpu=(t1 - t0) / 5, cpu=(t2 - t1) / 5, ops=(m1["ops"] - m0["ops"]) / 5,
                      compiles=m1["compiles"] - m0["compiles"])))
"""

PADDED_TRAIN = r"""
import json, random, torch, torch.nn as nn, torch_tpu
torch_tpu.set_eager_mode(torch_tpu.EagerMode.%(mode)s)
torch.tpu.set_matmul_precision(torch.tpu.Precision.HIGHEST)
class M(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(100, 32)
        s.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True,
                                                                 dropout=0.0), 2)
        s.head = nn.Linear(32, 100)
    def forward(s, x, pad):
        return s.head(s.enc(s.emb(x), src_key_padding_mask=pad))
def run(dev, fixed):
    torch.manual_seed(0); rng = random.Random(0)
    m = M().to(dev); opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    c0 = torch_tpu.metrics.report()["compiles"]; losses = []
    for step in range(12):
        lens = [rng.randint(3, 69) for _ in range(6)]
        T = 69 if fixed else max(lens)
        x = torch.zeros(6, T, dtype=torch.long); pad = torch.ones(6, T, dtype=torch.bool)
        for i, l in enumerate(lens):
            x[i, :l] = torch.randint(1, 100, (l,)); pad[i, :l] = False
        x, pad = x.to(dev), pad.to(dev)
        out = m(x, pad)
        loss = nn.functional.cross_entropy(out[:, :-1].reshape(-1, 100), x[:, 1:].reshape(-1), ignore_index=0)
        opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
    return torch_tpu.metrics.report()["compiles"] - c0, losses
fixed, _ = run("tpu", True)
varied, got = run("tpu", False)
_, ref = run("cpu", False)
print(json.dumps(dict(fixed=fixed, varied=varied, diff=max(abs(a - b) for a, b in zip(got, ref)))))
"""

PADDED_GENERATE = LLAMA + r"""
torch.tpu.set_matmul_precision(torch.tpu.Precision.HIGHEST)
torch_tpu.set_eager_mode(torch_tpu.EagerMode.%(mode)s)
g = torch.Generator().manual_seed(1)
rows = []
for L in (7, 19, 11, 33, 26, 41, 29, 58, 3, 47):
    lens = [L, max(1, L - 4), max(1, L // 2)]
    ids = torch.zeros(3, L, dtype=torch.long); am = torch.zeros(3, L, dtype=torch.long)
    for i, l in enumerate(lens):
        ids[i, L - l:] = torch.randint(2, 256, (l,), generator=g); am[i, L - l:] = 1
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    c0 = torch_tpu.metrics.report()["compiles"]
    with torch.no_grad():
        out = tpu.generate(input_ids=ids.to("tpu"), attention_mask=am.to("tpu"), **kw).cpu()
        ref = cpu.generate(input_ids=ids, attention_mask=am, **kw)
    rows.append(dict(L=L, compiles=torch_tpu.metrics.report()["compiles"] - c0, equal=bool(torch.equal(out, ref))))
print(json.dumps(rows))
"""


def fresh(code, **env_extra):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR="", **env_extra)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def generate():
    print("## (a) HF tiny Llama generate(max_new_tokens=24), 10 prompt lengths, cold cache\n")
    print("| mode | prompt | compiles | tpu s | CPU eager s | tpu / CPU | tokens equal CPU |\n|---|---|---|---|---|---|---|")
    for mode in ("DEFER_NEVER", "DEFER_AND_FUSE"):
        rows = fresh(GENERATE % {"mode": mode})
        for r in rows:
            print(f"| {mode} | {r['L']} | {r['compiles']} | {r['tpu']:.2f} | {r['cpu']:.3f} | {r['tpu'] / r['cpu']:.1f}x | {r['equal']} |")
        later = rows[2:]
        print(f"| {mode} | calls 3-10 | max {max(r['compiles'] for r in later)} per call | "
              f"{sum(r['tpu'] for r in later):.2f} | {sum(r['cpu'] for r in later):.2f} | "
              f"{sum(r['tpu'] for r in later) / sum(r['cpu'] for r in later):.1f}x | {all(r['equal'] for r in rows)} |")
    print()


def train():
    r = fresh(TRAIN % {"examples": os.path.join(ROOT, "examples")})
    print("## (b) GPT training, 30 batches of random lengths 16..256 vs fixed length 256 (DeferAndFuse)\n")
    print("| run | compiles | median step (last 10) |\n|---|---|---|")
    print(f"| fixed 256 | {r['fixed_compiles']} | {1000 * r['fixed_step']:.1f} ms |")
    print(f"| random 16..256 | {r['varied_compiles']} | {1000 * r['varied_step']:.1f} ms |")
    print(f"\ncompiles {r['varied_compiles'] / max(r['fixed_compiles'], 1):.2f}x the fixed run's; "
          f"step time {r['varied_step'] / r['fixed_step']:.2f}x\n")


def compiled():
    r = fresh(COMPILED % {"examples": os.path.join(ROOT, "examples")})
    print("## (c) torch.compile(GPT, dynamic=True), 12 sequence lengths 16..256\n")
    print("| bucket | compiles |\n|---|---|")
    for b, n in sorted(r.items(), key=lambda kv: int(kv[0])):
        print(f"| {b} | {n} |")
    print()


def compile_cost():
    rows = fresh(COMPILE_COST)
    print("## (d) one compile on this plugin, by program size (DeferAndFuse, chained elementwise ops)\n")
    print("| ops | static / bucketed | program text | s per compile |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {'bucketed' if r['dynamic'] else 'static'} | {r['bytes'] / 1024:.0f} KiB | {r['seconds']:.3f} |")
    print()


def steady():
    print("## (e) generate() in the steady state (prompt 23, 5 calls): bucketed vs fixed shapes\n")
    print("| mode | shapes | s per call | CPU eager s | tpu / CPU | ops per call | compiles |\n|---|---|---|---|---|---|---|")
    for mode in ("DEFER_NEVER", "DEFER_AND_FUSE"):
        for label, env in (("bucketed", {}), ("fixed (TORCH_TPU_DYNAMIC=0)", {"TORCH_TPU_DYNAMIC": "0"})):
            r = fresh(STEADY % {"mode": mode}, **env)
            print(f"| {mode} | {label} | {r['tpu']:.3f} | {r['cpu']:.3f} | {r['tpu'] / r['cpu']:.1f}x | {r['ops']:.0f} | {r['compiles']} |")
    print()


def padded():
    print("## (f) padded batches: nn.TransformerEncoder training and batched left-padded generate()\n")
    print("| mode | training compiles, random lengths 3..69 | at fixed length 69 | ratio | max loss diff vs CPU |\n|---|---|---|---|---|")
    for mode in ("DEFER_NEVER", "DEFER_AND_FUSE"):
        r = fresh(PADDED_TRAIN % {"mode": mode})
        print(f"| {mode} | {r['varied']} | {r['fixed']} | {r['varied'] / max(r['fixed'], 1):.2f}x | {r['diff']:.1e} |")
    print("\n| mode | compiles per call, L = 7, 19, 11, 33, 26, 41, 29, 58, 3, 47 | tokens equal CPU |\n|---|---|---|")
    for mode in ("DEFER_NEVER", "DEFER_AND_FUSE"):
        rows = fresh(PADDED_GENERATE % {"mode": mode})
        print(f"| {mode} | {', '.join(str(r['compiles']) for r in rows)} | {all(r['equal'] for r in rows)} |")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["generate", "train", "compiled", "compile-cost", "steady", "padded"])
    a = ap.parse_args()
    for name, fn in (("generate", generate), ("train", train), ("compiled", compiled), ("compile-cost", compile_cost),
                     ("steady", steady), ("padded", padded)):
        if a.only in (None, name):
            fn()


if __name__ == "__main__":
    main()
