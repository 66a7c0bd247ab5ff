"""What attaching to a device owner costs (torch_tpu/owner.py): a process that opens the device
itself against one attached to `python -m torch_tpu.owner` (every PJRT call a request over the
owner's Unix socket), each part in a fresh process, side by side in one run:

  .venv/bin/python bench/bench_owner.py

- Strict per-op time: `y = x + 1` on a 1000-element float32 tensor, 2000 times after warm-up.
- DeferAndFuse step: a 4-layer MLP forward + backward + SGD step (hidden 256, batch 64), 50 steps.
- Host transfers: 64 MiB to the device and back, 5 times each (MB/s).
- Sharing: `torch_tpu.owner.share` of a 64 MiB tensor and `open()` in another process (ms).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PART = r"""
import json, statistics, time, torch, torch_tpu
res = {}
x = torch.randn(1000, device="tpu")
for _ in range(50):
    y = x + 1
torch.tpu.synchronize()
t0 = time.perf_counter()
for _ in range(2000):
    y = x + 1
torch.tpu.synchronize()
res["strict_op_us"] = (time.perf_counter() - t0) / 2000 * 1e6

torch.manual_seed(0)
layers = []
for _ in range(4):
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
data = torch.randn(64, 256, device="tpu")
def step():
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        loss = model(data).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.item()
for _ in range(5):
    step()
t0 = time.perf_counter()
for _ in range(50):
    step()
res["fused_step_ms"] = (time.perf_counter() - t0) / 50 * 1e3

big = torch.randn(16 << 20)  # 64 MiB
ups, downs = [], []
for _ in range(5):
    t0 = time.perf_counter(); d = big.to("tpu"); torch.tpu.synchronize(); ups.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); h = d.cpu(); downs.append(time.perf_counter() - t0)
res["h2d_MBps"] = 64 * 1.048576 / statistics.median(ups)
res["d2h_MBps"] = 64 * 1.048576 / statistics.median(downs)
print("RESULT " + json.dumps(res))
"""

SHARE = r"""
import json, pickle, sys, time, torch, torch_tpu.owner as o
t = torch.randn(16 << 20, device="tpu")
torch.tpu.synchronize()
t0 = time.perf_counter(); h = o.share(t); dt = time.perf_counter() - t0
sys.stdout.write("RESULT " + json.dumps({"share_ms": dt * 1e3, "handle": pickle.dumps(h).hex()}) + "\n")
sys.stdout.flush()
sys.stdin.readline()
"""

OPEN = r"""
import json, pickle, sys, time, torch
h = pickle.loads(bytes.fromhex(sys.argv[1]))
t0 = time.perf_counter(); t = h.open(); dt = time.perf_counter() - t0
print("RESULT " + json.dumps({"open_ms": dt * 1e3, "numel": t.numel()}))
"""


def result(out):
    return json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])


def run(code, env, *argv):
    p = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=900)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return result(p.stdout)


def main():
    base = dict(os.environ)
    base.pop("TORCH_TPU_OWNER", None)
    direct = run(PART, base)
    d = tempfile.mkdtemp(prefix="bench_owner_")
    sock, log = os.path.join(d, "owner.sock"), os.path.join(d, "owner.log")
    with open(log, "w") as f:
        owner = subprocess.Popen([sys.executable, "-m", "torch_tpu.owner", "--socket", sock], stderr=f, env=base)
    try:
        while "serves" not in open(log).read():
            if owner.poll() is not None:
                raise SystemExit(open(log).read())
            time.sleep(0.05)
        env = dict(base, TORCH_TPU_OWNER=sock)
        attached = run(PART, env)
        exporter = subprocess.Popen([sys.executable, "-c", SHARE], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
        shared = result(exporter.stdout.readline())
        opened = run(OPEN, env, shared["handle"])
        exporter.communicate("\n", timeout=60)
    finally:
        owner.terminate()
        owner.wait(60)
    print("| measurement | own device | attached to an owner | attached / own |")
    print("|---|---|---|---|")
    for key, name in (("strict_op_us", "Strict op (us)"), ("fused_step_ms", "DeferAndFuse MLP step (ms)"),
                      ("h2d_MBps", "64 MiB to the device (MB/s)"), ("d2h_MBps", "64 MiB to the host (MB/s)")):
        print(f"| {name} | {direct[key]:.1f} | {attached[key]:.1f} | {attached[key] / direct[key]:.2f}x |")
    print(f"| share 64 MiB / open it in another process (ms) | - | {shared['share_ms']:.2f} / "
          f"{opened['open_ms']:.2f} | |")


if __name__ == "__main__":
    main()
