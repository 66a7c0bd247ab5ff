"""The persistent compile cache: a second run of the same program compiles
nothing; corrupt entries are detected and recompiled, never crash."""
import os
import subprocess
import sys

CODE = r"""
import torch, torch_tpu
torch_tpu.set_eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).to("tpu")
opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
x = torch.randn(32, 8, device="tpu"); y = torch.randint(0, 2, (32,), device="tpu")
for _ in range(3):
    loss = torch.nn.functional.cross_entropy(m(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    v = loss.item()
r = torch_tpu.metrics.report()
print("RESULT", r["compiles"], r["disk_cache_hits"], r["disk_cache_errors"], f"{v:.6f}")
"""


def run(cache_dir):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")][0].split()
    return int(line[1]), int(line[2]), int(line[3]), line[4]


def test_second_run_compiles_nothing(tmp_path):
    c1, h1, e1, loss1 = run(tmp_path)
    assert c1 > 0 and h1 == 0
    assert len(list(tmp_path.glob("*.bin"))) >= c1
    c2, h2, e2, loss2 = run(tmp_path)
    assert c2 == 0 and h2 == c1 and e2 == 0
    assert loss1 == loss2


def test_corrupt_entries_are_recompiled(tmp_path):
    c1, _, _, loss1 = run(tmp_path)
    files = sorted(tmp_path.glob("*.bin"))
    for i, f in enumerate(files):  # truncate some, scribble over the others
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2] if i % 2 else b"garbage" + data[7:])
    c2, h2, e2, loss2 = run(tmp_path)
    assert e2 == len(files) and c2 == c1 and loss2 == loss1
    c3, h3, e3, _ = run(tmp_path)  # rewritten entries are good again
    assert c3 == 0 and e3 == 0
