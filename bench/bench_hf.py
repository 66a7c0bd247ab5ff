"""HuggingFace benchmarks side by side (one run, one machine; report ratios).

  python bench/bench_hf.py                 # both
  python bench/bench_hf.py --only train    # (a) tiny Llama training step with AdamW
  python bench/bench_hf.py --only generate # (b) 32-token greedy generate()

(a) LlamaForCausalLM (vocab 256, hidden 64, 2 layers, 4 heads, seq 32, batch 8, random weights):
    forward with labels, backward, AdamW step, loss.item() per step. tpu DeferAndFuse against
    PyTorch CPU eager: median ms per step over --steps steps after --warmup steps.
(b) the same model's generate() (batch 1, prompt 8, 32 new tokens, greedy, dynamic cache):
    ms per call, median of --calls calls after one warm-up call.
The modes alternate over --rounds rounds in one process; the best round of each is reported.
"""
import argparse
import copy
import statistics
import time

import torch


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                      pad_token_id=0, bos_token_id=1, eos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


class Train:
    def __init__(self, base, device, batch, seq):
        self.device = device
        self.model = copy.deepcopy(base).to(device).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(2, 256, (batch, seq), generator=g).to(device)

    def step(self):
        loss = self.model(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()


class Generate:
    def __init__(self, base, device, prompt, new):
        self.model = copy.deepcopy(base).to(device).eval()
        g = torch.Generator().manual_seed(2)
        self.ids = torch.randint(2, 256, (1, prompt), generator=g).to(device)
        self.attn = torch.ones_like(self.ids)
        self.new = new

    def step(self):
        with torch.no_grad():
            out = self.model.generate(input_ids=self.ids, attention_mask=self.attn, max_new_tokens=self.new,
                                      min_new_tokens=self.new, do_sample=False, pad_token_id=0)
        return out.cpu()


def timed(runner, n, mode):
    import torch_tpu

    times = []
    with torch_tpu.eager_mode(mode):
        for _ in range(n):
            t0 = time.perf_counter()
            runner.step()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(name, runners, warmup, n, rounds):
    import torch_tpu

    modes = {"cpu": torch_tpu.EagerMode.DEFER_NEVER, "tpu": torch_tpu.EagerMode.DEFER_AND_FUSE}
    for dev, r in runners.items():
        timed(r, warmup, modes[dev])
    best = {dev: float("inf") for dev in runners}
    per_round = []
    for _ in range(rounds):
        row = {}
        for dev, r in runners.items():  # alternate: cpu, tpu, cpu, tpu, ...
            row[dev] = timed(r, n, modes[dev])
            best[dev] = min(best[dev], row[dev])
        per_round.append(row)
    return best, per_round


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["train", "generate"], default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch_tpu
    import transformers

    print(f"tpu runs on: {torch.tpu.get_device_name()}; torch {torch.__version__}; transformers "
          f"{transformers.__version__}; CPU threads {torch.get_num_threads()}; tpu precision DEFAULT")
    base = llama()
    rows = []
    if args.only in (None, "train"):
        runners = {d: Train(base, d, batch=8, seq=32) for d in ("cpu", "tpu")}
        best, per_round = compare("train", runners, args.warmup, args.steps, args.rounds)
        rows.append(("(a) Llama train step, AdamW (b8 x s32)", best, per_round))
        torch_tpu.metrics.reset()
        runners["tpu"].step()
        fb = torch_tpu.metrics.cpu_fallbacks()
        print(f"train: cpu fallbacks in a tpu step: {fb or 'none'}")
    if args.only in (None, "generate"):
        runners = {d: Generate(base, d, prompt=8, new=32) for d in ("cpu", "tpu")}
        best, per_round = compare("generate", runners, 1, args.calls, args.rounds)
        rows.append(("(b) Llama generate, 32 tokens greedy (b1, prompt 8)", best, per_round))
        same = torch.equal(runners["cpu"].step(), runners["tpu"].step())
        print(f"generate: tpu tokens == cpu tokens: {same} (tpu matmuls at DEFAULT precision)")
    print()
    print("| benchmark | PyTorch CPU eager (ms) | tpu DeferAndFuse (ms) | tpu / cpu |")
    print("|---|---:|---:|---:|")
    for name, best, _ in rows:
        print(f"| {name} | {best['cpu'] * 1e3:.1f} | {best['tpu'] * 1e3:.1f} | {best['tpu'] / best['cpu']:.2f}x |")
    print()
    for name, _, per_round in rows:
        print(f"{name} per round (ms): " + ", ".join(
            f"cpu {r['cpu'] * 1e3:.1f} / tpu {r['tpu'] * 1e3:.1f}" for r in per_round))


if __name__ == "__main__":
    main()
