"""Greedy text generation with a compiled forward pass.

Trains examples/train_gpt.py's small GPT for a few steps, then decodes greedily
with `torch.compile(model)`: the context is padded to the model's block size so
every step has the same shapes and runs the same compiled program (a causal
model's logits at position t do not depend on the padding after it).

  python examples/generate_gpt.py                 # tpu, compiled forward
  python examples/generate_gpt.py --device cpu    # PyTorch CPU (Inductor)
"""
import argparse
import time

import torch

from train_gpt import GPT, CharData, make_corpus


@torch.no_grad()
def generate(forward, prompt, n_new, block, device):
    """Greedy decoding; prompt: list of token ids. Returns the generated ids."""
    ids = list(prompt)
    buf = torch.zeros(1, block, dtype=torch.long, device=device)
    for _ in range(n_new):
        ctx = ids[-block:]
        buf.zero_()
        buf[0, : len(ctx)] = torch.tensor(ctx, device=device)
        logits, _ = forward(buf)
        ids.append(int(logits[0, len(ctx) - 1].argmax()))
    return ids[len(prompt):]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="tpu")
    ap.add_argument("--train-steps", type=int, default=80)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompt", default="the cat ")
    args = ap.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    block = 32
    data = CharData(make_corpus(), block, device)
    model = GPT(data.vocab, block=block).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.train_steps):
        x, y = data.batch(16, gen)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(f"trained {args.train_steps} steps, loss {loss.item():.3f}")

    model.eval()
    itos = {i: c for c, i in data.stoi.items()}
    prompt = [data.stoi[c] for c in args.prompt]
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    out = generate(compiled, prompt, args.tokens, block, device)
    t1 = time.perf_counter()
    out2 = generate(compiled, prompt, args.tokens, block, device)  # warm: no compile
    t2 = time.perf_counter()
    eager = generate(model, prompt, args.tokens, block, device)
    t3 = time.perf_counter()
    print(f"compiled: {args.prompt}{''.join(itos[i] for i in out)!r}")
    print(f"eager:    {args.prompt}{''.join(itos[i] for i in eager)!r}")
    print(f"same tokens as eager: {out == eager == out2}")
    print(f"{args.tokens} tokens: compiled first run {t1 - t0:.2f} s (compile included), warm {(t2 - t1) * 1000:.0f} ms "
          f"({(t2 - t1) / args.tokens * 1000:.2f} ms/token), eager {(t3 - t2) * 1000:.0f} ms")
    if device.type == "tpu":
        import torch_tpu

        m = torch_tpu.metrics.report()
        print(f"compiled graphs {m['compiled_graphs']}, captures {m['captures']}, cpu fallbacks: "
              f"{m['cpu_fallbacks'] or 'none'}")
    return out == eager


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
