"""Bad input to the tpu_dist backend under torchrun (2 ranks): every case must raise a
clear error on the ranks concerned, within the group's timeout, and leave the process
(and, after an agreed mismatch, the group) usable. Run by test_distributed.py.

Prints "PASS <name>" per case and "ALL PASSED" at the end.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

LOCAL = int(os.environ["LOCAL_RANK"])
torch.tpu.set_device(LOCAL)
TPU = torch.device("tpu", LOCAL)
TIMEOUT = float(os.environ.get("DIST_ERRORS_TIMEOUT", "20"))
dist.init_process_group(timeout=datetime.timedelta(seconds=TIMEOUT))
R, W = dist.get_rank(), dist.get_world_size()
assert W == 2


def say(line):
    os.write(1, (line + "\n").encode())  # one write: the ranks share the launcher's stdout


def raises(name, fn, *needles, exc=RuntimeError, within=None):
    t0 = time.perf_counter()
    try:
        fn()
    except exc as e:
        msg = str(e)
        took = time.perf_counter() - t0
        for n in needles:
            assert n in msg, f"{name}: {n!r} not in error message:\n{msg}"
        if within is not None:
            assert took < within, f"{name}: took {took:.1f}s"
        say(f"PASS {name} | {took:.2f}s: {msg.splitlines()[0][:160]}")
        return msg
    raise AssertionError(f"{name}: no error raised")


def still_works(tag):
    t = torch.full((3,), float(R + 1), device=TPU)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((3,), 3.0)), (tag, t)


# ---- mismatched calls: both ranks raise at once, the group stays in step
raises("all_reduce with different sizes",
       lambda: dist.all_reduce(torch.ones(10 if R == 0 else 20, device=TPU)),
       "ranks of this group made different calls", "rank 0: ALLREDUCE(dtype Float, 10 elements",
       "rank 1: ALLREDUCE(dtype Float, 20 elements", within=5)
still_works("after a size mismatch")
raises("all_reduce with different dtypes",
       lambda: dist.all_reduce(torch.ones(4, device=TPU, dtype=torch.float32 if R == 0 else torch.int64)),
       "different calls", "dtype Long", within=5)
raises("different collectives on the ranks",
       lambda: dist.all_reduce(torch.ones(4, device=TPU)) if R == 0 else dist.broadcast(torch.ones(4, device=TPU), 0),
       "different calls", "ALLREDUCE", "BROADCAST", within=5)
raises("all_gather_into_tensor with different input sizes",
       lambda: dist.all_gather_into_tensor(torch.empty(2 * (3 + R), device=TPU), torch.ones(3 + R, device=TPU)),
       "different calls", within=5)
raises("all_to_all_single with inconsistent splits",
       lambda: dist.all_to_all_single(torch.empty(4, device=TPU), torch.ones(4, device=TPU),
                                      [2, 2], [1, 3] if R == 0 else [2, 2]),
       "different calls", "sends [1, 3]", within=5)
raises("broadcast from different roots",
       lambda: dist.broadcast(torch.ones(4, device=TPU), R), "different calls", "root", within=5)
still_works("after the mismatches")

# ---- local argument errors (no communication)
raises("all_gather_into_tensor output of the wrong size",
       lambda: dist.all_gather_into_tensor(torch.empty(5, device=TPU), torch.ones(3, device=TPU)),
       "tpu_dist: all_gather_into_tensor: the output has 5 elements, expected 2 x 3")
raises("ReduceOp.AVG on an integer tensor",
       lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64, device=TPU), dist.ReduceOp.AVG),
       "ReduceOp.AVG needs a floating-point tensor")
raises("ReduceOp.BAND on a float tensor",
       lambda: dist.all_reduce(torch.ones(3, device=TPU), dist.ReduceOp.BAND),
       "ReduceOp.BAND needs an integer or bool tensor")
raises("a CPU tensor on a tpu_dist-only group",
       lambda: dist.all_reduce(torch.ones(3), group=dist.new_group([0, 1], backend="tpu_dist")),
       "cpu")
still_works("after local errors")

# ---- point to point: the receiver's tensor does not match what was sent
if R == 0:
    dist.send(torch.arange(3.0, device=TPU), 1)
    dist.send(torch.arange(4.0, device=TPU), 1)
else:
    raises("recv into a tensor of the wrong size",
           lambda: dist.recv(torch.empty(5, device=TPU), 0),
           "tpu_dist: recv: rank 0 sent 3 elements of Float, but the receiving tensor has 5 elements", within=5)
    t = torch.empty(4, device=TPU)
    dist.recv(t, 0)  # the next message still arrives intact
    assert torch.equal(t.cpu(), torch.arange(4.0))
    say("PASS recv after a mismatched recv")
still_works("after the p2p mismatch")

# ---- a destroyed group
g = dist.new_group([0, 1])
dist.all_reduce(torch.ones(2, device=TPU), group=g)
dist.destroy_process_group(g)
raises("collective on a destroyed group",
       lambda: dist.all_reduce(torch.ones(2, device=TPU), group=g),
       exc=(RuntimeError, ValueError))
still_works("after destroying a subgroup")

# ---- a rank that never arrives: the other one fails at the group's timeout
short = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
if R == 0:
    raises("a collective rank 1 never joins",
           lambda: dist.all_reduce(torch.ones(2, device=TPU), group=short),
           "tpu_dist: allreduce: the ranks could not agree on this call", within=3 + 10)
dist.barrier()  # the default group (cpu half) still works
say("ALL PASSED")
os._exit(0)  # the short group is out of step now; skip its orderly shutdown
