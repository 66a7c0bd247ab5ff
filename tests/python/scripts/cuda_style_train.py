"""A training script as written for "cuda": only DEVICE changes. MLP and a small
transformer, AdamW, dropout, views, in-place ops, .item(), printing, save/load.
Prints one line per step: 'loss <value>'."""
import io
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
DROPOUT = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 12


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = self.drop(h)
        return self.fc2(h)


class TinyTransformer(nn.Module):
    def __init__(self, vocab=20, d=32, heads=4, T=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, T, d))
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Dropout(DROPOUT), nn.Linear(64, d))
        self.head = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, idx):
        B, T = idx.shape
        x = self.emb(idx) + self.pos[:, :T]
        h = self.ln1(x)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=DROPOUT if self.training else 0.0)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, -1))
        x = x + self.ff(self.ln2(x))
        return self.head(x)


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    mlp = MLP().to(DEVICE)
    tr = TinyTransformer().to(DEVICE)
    opt = torch.optim.AdamW(list(mlp.parameters()) + list(tr.parameters()), lr=1e-2)
    X = torch.randn(64, 16, generator=g)
    Y = (X[:, :4].argmax(1) + (X[:, 4] > 0).long()) % 4
    seqs = torch.randint(0, 20, (32, 9), generator=g)
    for step in range(STEPS):
        xb = X.to(DEVICE)
        yb = Y.to(DEVICE)
        s = seqs.to(DEVICE)
        logits = mlp(xb)
        loss1 = F.cross_entropy(logits, yb)
        out = tr(s[:, :-1])
        loss2 = F.cross_entropy(out.reshape(-1, out.size(-1)), s[:, 1:].reshape(-1))
        loss = loss1 + loss2
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(mlp.parameters()) + list(tr.parameters()), 1.0)
        opt.step()
        with torch.no_grad():
            mlp.fc1.weight[:, 0].mul_(0.999)      # an in-place update through a view
        print(f"loss {loss.item():.6f}")
    # printing and save/load round trip
    print(repr(mlp.fc2.bias.detach()[:2]).split("device")[0])
    buf = io.BytesIO()
    torch.save({"mlp": mlp.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf)
    mlp2 = MLP().to(DEVICE)
    mlp2.load_state_dict(ck["mlp"])
    mlp.eval(); mlp2.eval()
    print("reload_equal", torch.equal(mlp(xb).cpu(), mlp2(xb).cpu()))


if __name__ == "__main__":
    main()
