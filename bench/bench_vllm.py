"""vLLM on tpu against transformers (run with .venv-vllm's python; each part in a fresh process):

  .venv-vllm/bin/python bench/bench_vllm.py                 # every part, the issue's sizes
  .venv-vllm/bin/python bench/bench_vllm.py --requests 16   # fewer requests (quicker)

The model: a random LlamaForCausalLM (hidden 512, 4 layers, 8 heads / 4 KV heads, vocab 512,
float32), written locally. The load: `--requests` prompts (default 64) of random lengths 16..256
(seeded), 64 output tokens each (ignore_eos), greedy.

(a) vLLM offline `LLM.generate` on tpu, all requests at once, compiled (the default
    `enforce_eager=False`: every step program compiled at start-up) and `enforce_eager=True` (step
    programs compiled when first met): output tokens/s, mean TTFT and TPOT from vLLM's request
    metrics, compiles during generate; the engine's start-up seconds with a cold compile cache (a
    fresh TORCH_TPU_CACHE_DIR per mode) and then warm (same dir).
(b) transformers `generate` on tpu, one request at a time (what a user does without a server),
    on the first `--hf-requests` prompts (default 8): output tokens/s.
(c) transformers `generate` on PyTorch CPU, batched with left padding, batch sizes 8/16/32/64:
    the best output tokens/s.
Ratios are taken between parts of one run (this machine is shared and noisy).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "vllm"))


def prompts(n, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 257, (n,), generator=g).tolist()
    return [torch.randint(3, 512, (k,), generator=g).tolist() for k in lengths]


def make_model(path):
    import tiny

    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = tiny.llama_config(hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                                num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                                max_position_embeddings=512, initializer_range=0.02)
        tiny.write_model(path, cfg)
    return path


def part_vllm(args, eager=False):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch_tpu
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype="float32", enforce_eager=eager, max_model_len=512,
              kv_cache_memory_bytes=1 << 30, seed=0, disable_log_stats=False)
    startup = time.perf_counter() - t0
    ps = [TokensPrompt(prompt_token_ids=p) for p in prompts(args.requests)]
    sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    c0 = torch_tpu.metrics.report()["compiles"]
    startup_compiles = c0
    t0 = time.perf_counter()
    outs = llm.generate(ps, sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    ntok = sum(len(o.outputs[0].token_ids) for o in outs)
    ttft, tpot = [], []
    for o in outs:
        m = o.metrics
        if m is not None and getattr(m, "first_token_latency", None) is not None:
            ttft.append(m.first_token_latency)
            if getattr(m, "last_token_ts", None) and getattr(m, "first_token_ts", None):
                tpot.append((m.last_token_ts - m.first_token_ts) / max(len(o.outputs[0].token_ids) - 1, 1))
    return dict(startup_s=startup, startup_compiles=startup_compiles, seconds=dt, tokens=ntok, tok_per_s=ntok / dt,
                compiles=torch_tpu.metrics.report()["compiles"] - c0,
                ttft_s=sum(ttft) / len(ttft) if ttft else None,
                tpot_s=sum(tpot) / len(tpot) if tpot else None)


def part_hf_tpu(args):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to("tpu").eval()
    torch.set_float32_matmul_precision("highest")
    ps = prompts(args.requests)[: args.hf_requests]
    t0 = time.perf_counter()
    ntok = 0
    with torch.no_grad():
        for p in ps:
            ids = torch.tensor([p], device="tpu")
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64,
                                 min_new_tokens=64, do_sample=False, pad_token_id=0)
            ntok += out.shape[1] - len(p)
    dt = time.perf_counter() - t0
    return dict(seconds=dt, tokens=ntok, tok_per_s=ntok / dt)


def part_hf_cpu(args):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    ps = prompts(args.requests)
    best = {}
    for bs in (8, 16, 32, 64):
        if bs > len(ps):
            break
        t0 = time.perf_counter()
        ntok = 0
        with torch.no_grad():
            for i in range(0, len(ps), bs):
                chunk = ps[i:i + bs]
                width = max(len(p) for p in chunk)
                ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk])
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
                out = model.generate(ids, attention_mask=mask, max_new_tokens=64, min_new_tokens=64,
                                     do_sample=False, pad_token_id=0)
                ntok += (out.shape[1] - width) * len(chunk)
        dt = time.perf_counter() - t0
        best[bs] = ntok / dt
    bs = max(best, key=best.get)
    return dict(tok_per_s=best[bs], best_batch=bs, by_batch=best)


PARTS = {"vllm": part_vllm, "vllm_eager": lambda args: part_vllm(args, eager=True), "hf_tpu": part_hf_tpu, "hf_cpu": part_hf_cpu}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--hf-requests", type=int, default=8)
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "torch_tpu_bench_vllm_llama512"))
    ap.add_argument("--part")
    ap.add_argument("--only", nargs="*", default=list(PARTS))
    args = ap.parse_args()
    if args.part:
        print("RESULT " + json.dumps(PARTS[args.part](args)))
        return
    make_model(args.model)
    results = {}
    for name in args.only:
        runs = ["cold", "warm"] if name.startswith("vllm") else [""]
        cache = tempfile.mkdtemp(prefix="tt_vllm_cache_")  # one per part: each mode starts cold
        env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", TORCH_TPU_CACHE_DIR=cache)
        for run in runs:
            p = subprocess.run([sys.executable, __file__, "--part", name, "--model", args.model,
                                "--requests", str(args.requests), "--hf-requests", str(args.hf_requests)],
                               env=env, capture_output=True, text=True)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            if p.returncode or not line:
                print(p.stderr[-4000:])
                raise SystemExit(f"part {name} failed")
            key = f"{name}_{run}" if run else name
            results[key] = json.loads(line[-1][7:])
            print(key, results[key], flush=True)
    for key, mode in (("vllm_warm", "compiled"), ("vllm_eager_warm", "enforce_eager")):
        if key not in results:
            continue
        v = results[key]["tok_per_s"]
        if "hf_tpu" in results:
            print(f"vLLM (tpu, {mode}) / transformers one at a time (tpu): {v / results['hf_tpu']['tok_per_s']:.2f}x")
        if "hf_cpu" in results:
            print(f"vLLM (tpu, {mode}) / transformers batched (PyTorch CPU, best batch): "
                  f"{v / results['hf_cpu']['tok_per_s']:.2f}x")


if __name__ == "__main__":
    main()
