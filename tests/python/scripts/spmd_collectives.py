"""In-program collectives: functions with PyTorch's functional collectives captured
into ONE program for 2 replicas on tpu:0 and tpu:1 of this process (run with
TORCH_TPU_NUM_DEVICES=2 by test_distributed.py). Results are compared with the
same arithmetic on CPU. Prints "PASS <name>" per check and "ALL PASSED"."""
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.testing._internal.distributed.fake_pg import FakeStore

import torch_tpu
import torch_tpu.spmd as spmd

assert torch.tpu.device_count() == 2, "run with TORCH_TPU_NUM_DEVICES=2"
torch.set_float32_matmul_precision("highest")
c10d = torch.ops._c10d_functional
N = 2


def say(line):
    os.write(1, (line + "\n").encode())


def per_replica(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=g) for s in shapes] for _ in range(N)]


def run(prog, cpu_args):
    outs = prog([[t.to(f"tpu:{r}") for t in cpu_args[r]] for r in range(N)])
    for r in range(N):
        for o in (outs[r] if isinstance(outs[r], (tuple, list)) else [outs[r]]):
            assert o.device == torch.device("tpu", r), (r, o.device)
    return [[o.cpu() for o in (outs[r] if isinstance(outs[r], (tuple, list)) else [outs[r]])] for r in range(N)]


def close(a, b, name):
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


# ---- every collective, by the ops' own names
def ops_program(x, w):
    y = x @ w
    s = c10d.wait_tensor(c10d.all_reduce(y, "sum", "g"))
    m = c10d.all_reduce(y, "max", "g")
    a = c10d.all_reduce(y, "avg", "g")
    g = c10d.all_gather_into_tensor(x, N, "g")
    rs = c10d.reduce_scatter_tensor(y, "sum", N, "g")
    a2a = c10d.all_to_all_single(x, [2, 2], [2, 2], "g")
    return torch.relu(s) + 1, m, a, g, rs, a2a


args = per_replica((4, 3), (3, 6), seed=1)
prog = spmd.replicate(ops_program, N)
out = run(prog, args)
ys = [args[r][0] @ args[r][1] for r in range(N)]
total = sum(ys)
for r in range(N):
    s, m, a, g, rs, a2a = out[r]
    close(s, torch.relu(total) + 1, "all_reduce sum")
    close(m, torch.maximum(ys[0], ys[1]), "all_reduce max")
    close(a, total / N, "all_reduce avg")
    close(g, torch.cat([args[q][0] for q in range(N)]), "all_gather_into_tensor")
    close(rs, total[2 * r:2 * r + 2], "reduce_scatter_tensor")
    close(a2a, torch.cat([args[q][0][2 * r:2 * r + 2] for q in range(N)]), "all_to_all_single")
text = prog.text
for op in ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all",
           "replica_groups = dense<[[0, 1]]>", "mhlo.num_replicas = 2"):
    assert op in text, op
say("PASS functional collectives lowered into one replicated program")

# ---- the same through torch.distributed._functional_collectives with a process group
dist.init_process_group("fake", rank=0, world_size=N, store=FakeStore())


def data_parallel_step(x, w, target):
    # a data-parallel SGD step: local gradient, in-program all-reduce (mean), update
    pred = x @ w
    grad = x.t() @ (pred - target) * (2.0 / pred.numel())
    grad = funcol.all_reduce(grad, "avg", dist.group.WORLD)
    return w - 0.1 * grad, funcol.all_gather_tensor(pred, 0, dist.group.WORLD)


args = per_replica((8, 3), (3, 2), (8, 2), seed=2)
for r in range(N):
    args[r][1] = args[0][1].clone()  # replicated weights
out = run(spmd.replicate(data_parallel_step, N), args)
grads = []
for r in range(N):
    x, w, t = args[r]
    grads.append(x.t() @ (x @ w - t) * (2.0 / t.numel()))
new_w = args[0][1] - 0.1 * (grads[0] + grads[1]) / N
for r in range(N):
    close(out[r][0], new_w, "SGD step with an in-program all_reduce(avg)")
    close(out[r][1], torch.cat([args[q][0] @ args[q][1] for q in range(N)]), "all_gather_tensor")
say("PASS funcol on a process group inside a replicated program (data-parallel step)")

# ---- explicit replica groups: each replica alone
prog = spmd.replicate(lambda x: c10d.all_reduce(x, "sum", "solo"), N, groups={"solo": [[0], [1]]})
args = per_replica((5,), seed=3)
out = run(prog, args)
for r in range(N):
    close(out[r][0], args[r][0], "singleton replica groups")
say("PASS explicit replica groups")

# ---- an input the size policy (or the user) made dynamic: padded to its bucket, cut back to
# its size for the program (a PJRT input-size mismatch before)
staged = [[t.to(f"tpu:{r}") for t in args[r]] for r in range(N)]
for r in range(N):
    torch_tpu.mark_dynamic(staged[r][0], 0)
    assert torch_tpu.dynamic.get_dynamism_info(staged[r][0]) == [(0, 5, 8)]
out = prog(staged)
for r in range(N):
    close(out[r].cpu(), args[r][0], "a dynamic input of a replicated program")
say("PASS dynamic inputs")

# ---- errors: clear, and the device stays usable
try:
    spmd.replicate(lambda x: c10d.all_to_all_single(x, [1, 3], [3, 1], "g"), N)(
        [[torch.ones(4, device=f"tpu:{r}")] for r in range(N)])
    raise AssertionError("uneven all_to_all_single did not raise")
except RuntimeError as e:
    assert "equal splits" in str(e), e
try:
    spmd.replicate(lambda x: x.sum(), 3)
    raise AssertionError("3 replicas on 2 devices did not raise")
except ValueError as e:
    assert "TORCH_TPU_NUM_DEVICES" in str(e), e
try:
    spmd.replicate(lambda x: x.sum().item() * x, N)([[torch.ones(2, device=f"tpu:{r}")] for r in range(N)])
    raise AssertionError("a host read inside a replicated program did not raise")
except RuntimeError as e:
    assert "captured" in str(e) or "capture" in str(e), e
assert torch.equal((torch.ones(3, device="tpu:1") * 2).cpu(), torch.full((3,), 2.0))
say("PASS errors")
dist.destroy_process_group()
say("ALL PASSED")
