"""The per-op path as named stages (csrc/aten/dispatch/kernels.cpp, LoweredOp): TORCH_TPU_STAGE_TIMES=1
sums each stage's time over calls; torch_tpu._C._stage_times() reads them. Off by default."""
import json
import os
import subprocess
import sys

import torch

import torch_tpu

STAGES = {"devices", "arguments", "meta", "cpu_parity", "outputs", "compute_types", "bucketing", "transaction",
          "run", "results"}

_STRICT_LOOP = """
import json, torch, torch_tpu
x = torch.randn(1000, device="tpu")
for _ in range(5):
    x = x + 1
torch_tpu._C._stage_times(True)  # reset: the loop below only
for _ in range(50):
    x = x + 1
x.cpu()
print(json.dumps(torch_tpu._C._stage_times(False)))
"""


def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)


def test_every_stage_is_timed_once_per_op():
    r = _run(_STRICT_LOOP, TORCH_TPU_STAGE_TIMES="1")
    assert r.returncode == 0, r.stderr
    times = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(times) == STAGES
    for stage, (calls, ns) in times.items():
        assert calls == 50, (stage, calls)
        assert ns >= 0, stage
    # the op's own work (building or replaying it, running its program) is where time goes
    assert times["transaction"][1] + times["run"][1] > 0


def test_stage_clock_is_off_by_default():
    r = _run(_STRICT_LOOP)
    assert r.returncode == 0, r.stderr
    times = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(calls == 0 and ns == 0 for calls, ns in times.values())


def test_hooks_still_shape_their_ops():
    # the per-op hooks table: CPU index tensors, masks as coordinates, a mask over all of x,
    # nansum's empty dim list (all of which the generic stages would otherwise get wrong)
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    idx = torch.tensor([2, 0])
    torch.testing.assert_close(t[idx].cpu(), x[idx])
    mask = x > 5
    torch.testing.assert_close(t[mask.to("tpu")].cpu(), x[mask])
    t2, x2 = t.clone(), x.clone()
    t2[mask.to("tpu")] = -1.0
    x2[mask] = -1.0
    torch.testing.assert_close(t2.cpu(), x2)
    t3, x3 = t.clone(), x.clone()
    t3[idx] = 7.0
    x3[idx] = 7.0
    torch.testing.assert_close(t3.cpu(), x3)
    torch.testing.assert_close(torch.nansum(t, dim=[]).cpu(), torch.nansum(x, dim=[]))
