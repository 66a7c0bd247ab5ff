"""Train a small decoder-only transformer (GPT) on generated text.

Written the way a GPU user writes it -- plain torch.nn, AdamW, dropout -- with the
device as the only knob:  python examples/train_gpt.py --device tpu   (default)
                          python examples/train_gpt.py --device cpu   (PyTorch CPU, for comparison)
"""
import argparse
import math
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- data
def make_corpus(n_sentences=4000, seed=0):
    """A small generated corpus with learnable structure (a toy grammar)."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird", "the teacher"]
    verbs = ["sees", "likes", "builds", "finds", "paints", "follows", "remembers"]
    objects = ["the house", "a red ball", "the river", "an apple", "the machine", "a blue door", "the garden"]
    ends = [".", "!", " today.", " again.", " at night."]
    out = []
    for _ in range(n_sentences):
        out.append(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(ends)}")
    return " ".join(out)


class CharData:
    def __init__(self, text, block, device):
        chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab = len(chars)
        self.data = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        self.block, self.device = block, device

    def batch(self, batch_size, gen):
        ix = torch.randint(len(self.data) - self.block - 1, (batch_size,), generator=gen)
        x = torch.stack([self.data[i : i + self.block] for i in ix])
        y = torch.stack([self.data[i + 1 : i + 1 + self.block] for i in ix])
        return x.to(self.device), y.to(self.device)


# ---------------------------------------------------------------- model
class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, block, dropout):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads
        self.drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, d, heads, block, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, block, dropout)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d=64, layers=2, heads=4, block=32, dropout=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(d, heads, block, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="tpu")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--mode", choices=["strict", "debug", "fuse", "compiled"], default=None,
                    help="tpu eager mode (default: strict, or TORCH_TPU_* environment variables); "
                         "compiled: torch.compile the model and the optimizer step")
    args = ap.parse_args()

    if args.mode and args.mode != "compiled" and args.device.startswith("tpu"):
        import torch_tpu

        torch_tpu.set_eager_mode({"strict": torch_tpu.EagerMode.DEFER_NEVER,
                                  "debug": torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
                                  "fuse": torch_tpu.EagerMode.DEFER_AND_FUSE}[args.mode])
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "tpu":
        print(f"device tpu runs on: {torch.tpu.get_device_name()}")
    data = CharData(make_corpus(), args.block, device)
    model = GPT(data.vocab, d=args.d, layers=args.layers, block=args.block).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    print(f"params: {sum(p.numel() for p in model.parameters())}, vocab: {data.vocab}")
    forward, opt_step = model, opt.step
    if args.mode == "compiled":  # the default backend: "tpu" for tpu tensors, Inductor on the CPU
        forward, opt_step = torch.compile(model), torch.compile(opt.step)

    first = last = None
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = data.batch(args.batch, gen)
        _, loss = forward(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt_step()
        loss_val = loss.item()  # a host read: the step has finished here
        times.append(time.perf_counter() - t0)
        if first is None:
            first = loss_val
        last = loss_val
        if step % args.log_every == 0 or step == args.steps - 1:
            recent = times[-min(len(times), args.log_every):]
            st = sum(recent) / len(recent)
            print(f"step {step:4d}  loss {loss_val:.4f}  step {st * 1000:.1f} ms  "
                  f"{args.batch * args.block / st:.0f} tokens/s")
    steady = times[len(times) // 2:]
    st = sum(steady) / len(steady)
    print(f"first loss {first:.4f}  final loss {last:.4f}  steady step {st * 1000:.1f} ms  "
          f"{args.batch * args.block / st:.0f} tokens/s")
    if device.type == "tpu":
        import torch_tpu

        fb = torch_tpu.metrics.cpu_fallbacks()
        print(f"compiles {torch_tpu.metrics.compiles}, cpu fallbacks: {fb if fb else 'none'}")
    return first, last


if __name__ == "__main__":
    main()
