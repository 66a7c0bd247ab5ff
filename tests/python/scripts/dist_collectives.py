"""Every collective of the tpu_dist backend against the same call on CPU tensors over
gloo, in one torchrun job (the default group is "cpu:gloo,tpu:tpu_dist", so CPU
tensors go to stock gloo and tpu tensors to tpu_dist). Run by test_distributed.py:

    torchrun --standalone --nproc_per_node=2 dist_collectives.py

Prints "PASS <name>" per check; any failure raises (non-zero exit).
"""
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torch_tpu

LOCAL = int(os.environ["LOCAL_RANK"])
torch.tpu.set_device(LOCAL)
TPU = torch.device("tpu", LOCAL)
dist.init_process_group()  # no backend: cpu:gloo,tpu:tpu_dist
R, W = dist.get_rank(), dist.get_world_size()
assert W == 2, "written for 2 ranks"
assert dist.get_backend() == "cpu:gloo,tpu:tpu_dist", dist.get_backend()
assert torch.tpu.current_device() == LOCAL and torch.tpu.device_count() == W


def data(n, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * R + salt)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    return torch.randint(-50, 50, (n,), generator=g).to(dtype)


def same(tpu, cpu, name, exact=True):
    assert tpu.device.type == "tpu", (name, tpu.device)
    got = tpu.cpu()
    if exact:
        assert got.dtype == cpu.dtype and torch.equal(got, cpu), f"{name}: tpu {got} vs cpu {cpu}"
    else:
        torch.testing.assert_close(got, cpu, msg=name)


def say(line):
    os.write(1, (line + "\n").encode())  # one write: the ranks share the launcher's stdout


def check(name):
    def deco(fn):
        fn()
        say(f"PASS {name}")
        return fn

    return deco


@check("broadcast")
def _():
    for src in (0, 1):
        for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
            c = data(7, dtype, src)
            t = c.to(TPU)
            dist.broadcast(c, src)
            dist.broadcast(t, src)
            same(t, c, f"broadcast {dtype} src={src}")


@check("all_reduce ops and dtypes")
def _():
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        for dtype in (torch.float32, torch.int64, torch.int32, torch.bfloat16, torch.float16):
            c = data(33, dtype, 1)
            t = c.to(TPU)
            dist.all_reduce(c, op)
            dist.all_reduce(t, op)
            same(t, c, f"all_reduce {op} {dtype}")
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        c = data(9, torch.int64, 2)
        t = c.to(TPU)
        dist.all_reduce(c, op)
        dist.all_reduce(t, op)
        same(t, c, f"all_reduce {op}")
    # gloo has no AVG / PREMUL_SUM: compare with SUM then divide / scale then SUM on CPU
    c = data(16, torch.float32, 3)
    t = c.to(TPU)
    dist.all_reduce(t, dist.ReduceOp.AVG)
    dist.all_reduce(c)
    same(t, c / W, "all_reduce AVG")
    c = data(16, torch.float32, 4)
    t = c.to(TPU)
    dist.all_reduce(t, dist._make_nccl_premul_sum(0.25))
    c = c * 0.25
    dist.all_reduce(c)
    same(t, c, "all_reduce PREMUL_SUM")
    # 0-d and empty tensors
    c, t = torch.tensor(float(R + 1)), torch.tensor(float(R + 1), device=TPU)
    dist.all_reduce(c)
    dist.all_reduce(t)
    same(t, c, "all_reduce 0-d")
    t = torch.empty(0, device=TPU)
    dist.all_reduce(t)
    assert t.shape == (0,)


@check("all_reduce of views (non-contiguous in, slice out)")
def _():
    base_c = data(24, torch.float32, 5).view(4, 6)
    base_t = base_c.to(TPU)
    c, t = base_c.t(), base_t.t()  # transposed views: written through to the base
    dist.all_reduce(c)
    dist.all_reduce(t)
    same(base_t, base_c, "all_reduce transposed view")
    big_c = data(10, torch.float32, 6)
    big_t = big_c.to(TPU)
    dist.all_reduce(big_c[2:7])
    dist.all_reduce(big_t[2:7])
    same(big_t, big_c, "all_reduce of a slice leaves the rest")


@check("all_reduce coalesced")
def _():
    cs = [data(n, torch.float32, 10 + n) for n in (3, 5, 1)]
    ts = [c.to(TPU) for c in cs]
    with dist._coalescing_manager(device=TPU):
        for t in ts:
            dist.all_reduce(t)
    for c in cs:
        dist.all_reduce(c)
    for t, c in zip(ts, cs):
        same(t, c, "coalesced all_reduce")
    ts = [c.to(TPU) for c in cs]  # cs now hold the sums
    dist.all_reduce_coalesced(ts)
    for c in cs:
        dist.all_reduce(c)
    for t, c in zip(ts, cs):
        same(t, c, "all_reduce_coalesced")


@check("all_gather, all_gather_into_tensor (+ coalesced)")
def _():
    c = data(6, torch.float32, 20)
    outs_c = [torch.empty(6) for _ in range(W)]
    outs_t = [torch.empty(6, device=TPU) for _ in range(W)]
    dist.all_gather(outs_c, c)
    dist.all_gather(outs_t, c.to(TPU))
    for a, b in zip(outs_t, outs_c):
        same(a, b, "all_gather")
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        c = data(5, dtype, 21)
        oc = torch.empty(W * 5, dtype=dtype)
        ot = torch.empty(W * 5, dtype=dtype, device=TPU)
        dist.all_gather_into_tensor(oc, c)
        dist.all_gather_into_tensor(ot, c.to(TPU))
        same(ot, oc, f"all_gather_into_tensor {dtype}")
    # input is a slice of the output (as FSDP2 does it)
    ot = torch.zeros(W * 4, device=TPU)
    ot[R * 4:(R + 1) * 4] = torch.arange(4.0, device=TPU) + 10 * R
    dist.all_gather_into_tensor(ot, ot[R * 4:(R + 1) * 4])
    same(ot, torch.cat([torch.arange(4.0) + 10 * r for r in range(W)]), "all_gather in place")
    ins = [data(n, torch.float32, 30 + n) for n in (2, 3)]
    outs = [torch.empty(W * n, device=TPU) for n in (2, 3)]
    with dist._coalescing_manager(device=TPU):
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i.to(TPU))
    for o, i in zip(outs, ins):
        oc = torch.empty(o.shape)
        dist.all_gather_into_tensor(oc, i)
        same(o, oc, "coalesced all_gather_into_tensor")
    outs_l = [[torch.empty(n, device=TPU) for n in (2, 3)] for _ in range(W)]
    dist.all_gather_coalesced(outs_l, [i.to(TPU) for i in ins])
    for r in range(W):
        for k, n in enumerate((2, 3)):
            exp = [torch.empty(n) for _ in range(W)]
            dist.all_gather(exp, ins[k])
            same(outs_l[r][k], exp[r], "all_gather_coalesced")


@check("reduce_scatter, reduce_scatter_tensor (+ coalesced)")
def _():
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        c = data(W * 4, torch.float32, 40)
        oc, ot = torch.empty(4), torch.empty(4, device=TPU)
        dist.reduce_scatter_tensor(oc, c, op)
        dist.reduce_scatter_tensor(ot, c.to(TPU), op)
        same(ot, oc, f"reduce_scatter_tensor {op}")
    c = data(W * 4, torch.float32, 41)
    oc, ot = torch.empty(4), torch.empty(4, device=TPU)
    dist.reduce_scatter_tensor(oc, c)
    dist.reduce_scatter_tensor(ot, c.to(TPU), dist.ReduceOp.AVG)
    same(ot, oc / W, "reduce_scatter_tensor AVG")
    ot = torch.empty(4, device=TPU)
    dist.reduce_scatter_tensor(ot, c.to(TPU), dist._make_nccl_premul_sum(0.5))
    dist.reduce_scatter_tensor(oc, c * 0.5)
    same(ot, oc, "reduce_scatter_tensor PREMUL_SUM")
    ins = [data(3, torch.float32, 42 + r) for r in range(W)]
    oc, ot = torch.empty(3), torch.empty(3, device=TPU)
    dist.reduce_scatter(oc, ins)
    dist.reduce_scatter(ot, [i.to(TPU) for i in ins])
    same(ot, oc, "reduce_scatter (list)")
    ins = [data(W * n, torch.float32, 50 + n) for n in (2, 3)]
    outs = [torch.empty(n, device=TPU) for n in (2, 3)]
    with dist._coalescing_manager(device=TPU):
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i.to(TPU))
    for o, i in zip(outs, ins):
        oc = torch.empty(o.shape)
        dist.reduce_scatter_tensor(oc, i)
        same(o, oc, "coalesced reduce_scatter_tensor")


@check("all_to_all_single (even, uneven splits), all_to_all")
def _():
    c = data(W * 3, torch.float32, 60)
    oc, ot = torch.empty(W * 3), torch.empty(W * 3, device=TPU)
    dist.all_to_all_single(oc, c)
    dist.all_to_all_single(ot, c.to(TPU))
    same(ot, oc, "all_to_all_single")
    # rank r sends r+1+j rows to rank j (rows of 2 columns)
    in_splits = [R + 1 + j for j in range(W)]
    out_splits = [r + 1 + R for r in range(W)]
    c = data(sum(in_splits) * 2, torch.float32, 61).view(-1, 2)
    oc, ot = torch.empty(sum(out_splits), 2), torch.empty(sum(out_splits), 2, device=TPU)
    dist.all_to_all_single(oc, c, out_splits, in_splits)
    dist.all_to_all_single(ot, c.to(TPU), out_splits, in_splits)
    same(ot, oc, "all_to_all_single uneven")
    # list form with uneven sizes (as NCCL allows; gloo's list form does not, so the CPU
    # reference is the flat exchange): rank r sends j + 1 elements to rank j
    ins = [data(j + 1, torch.int64, 62 + j) for j in range(W)]
    outs_t = [torch.empty(R + 1, dtype=torch.int64, device=TPU) for _ in range(W)]
    dist.all_to_all(outs_t, [i.to(TPU) for i in ins])
    flat = torch.empty(W * (R + 1), dtype=torch.int64)
    dist.all_to_all_single(flat, torch.cat(ins), [R + 1] * W, [j + 1 for j in range(W)])
    for a, b in zip(outs_t, flat.split(R + 1)):
        same(a, b, "all_to_all")


@check("reduce, gather, scatter")
def _():
    for dst in (0, 1):
        c = data(5, torch.float32, 70)
        t = c.to(TPU)
        dist.reduce(c, dst)
        dist.reduce(t, dst)
        if R == dst:
            same(t, c, "reduce")
        else:  # not the root: left as it was
            same(t, data(5, torch.float32, 70), "reduce (non-root unchanged)")
        c = data(4, torch.float32, 71)
        gc = [torch.empty(4) for _ in range(W)] if R == dst else None
        gt = [torch.empty(4, device=TPU) for _ in range(W)] if R == dst else None
        dist.gather(c, gc, dst)
        dist.gather(c.to(TPU), gt, dst)
        if R == dst:
            for a, b in zip(gt, gc):
                same(a, b, "gather")
        sc = [data(3, torch.float32, 72 + k) for k in range(W)] if R == dst else None
        oc, ot = torch.empty(3), torch.empty(3, device=TPU)
        dist.scatter(oc, sc, dst)
        dist.scatter(ot, [s.to(TPU) for s in sc] if sc else None, dst)
        same(ot, oc, "scatter")


@check("send/recv, isend/irecv, batch_isend_irecv, recv from any source")
def _():
    peer = 1 - R
    if R == 0:
        dist.send(torch.arange(5.0, device=TPU), 1)
        t = torch.empty(3, dtype=torch.int64, device=TPU)
        src = dist.recv(t)  # any source
        assert src == 1, src
        same(t, torch.tensor([7, 8, 9]), "recv any source")
    else:
        t = torch.empty(5, device=TPU)
        dist.recv(t, 0)
        same(t, torch.arange(5.0), "recv")
        dist.send(torch.tensor([7, 8, 9], device=TPU), 0)
    # both ranks post the receive first, then send (needs asynchronous receives)
    rt = torch.empty(4, device=TPU)
    rq = dist.irecv(rt, peer, tag=3)
    sq = dist.isend(torch.full((4,), float(R), device=TPU), peer, tag=3)
    sq.wait()
    rq.wait()
    same(rt, torch.full((4,), float(peer)), "irecv/isend")
    rt = torch.empty(2, 3, device=TPU)
    ops = [dist.P2POp(dist.irecv, rt, peer), dist.P2POp(dist.isend, torch.ones(2, 3, device=TPU) * (R + 5), peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(rt, torch.ones(2, 3) * (peer + 5), "batch_isend_irecv")


@check("barrier")
def _():
    dist.barrier()
    dist.barrier(device_ids=[LOCAL])  # NCCL style: a barrier on the tpu backend


@check("async_op Work: wait, is_completed, futures, ordering")
def _():
    t = torch.ones(1000, device=TPU)
    w1 = dist.all_reduce(t, async_op=True)
    w2 = dist.all_reduce(t, async_op=True)  # must see the first one's result (in-order queue)
    w2.wait()
    assert w1.is_completed() and w2.is_completed() and w2.exception() is None
    same(t, torch.full((1000,), float(W * W)), "two queued all_reduce")
    t = torch.full((8,), float(R + 1), device=TPU)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert doubled.wait().device.type == "tpu"
    same(doubled.value(), torch.full((8,), 2.0 * sum(range(1, W + 1))), "future.then")
    assert fut.value()[0] is t or torch.equal(fut.value()[0].cpu(), t.cpu())
    out = torch.empty(W * 2, device=TPU)
    w = dist.all_gather_into_tensor(out, torch.full((2,), float(R), device=TPU), async_op=True)
    assert w.wait()
    same(out, torch.tensor([0.0, 0.0, 1.0, 1.0]), "async all_gather_into_tensor")


@check("functional collectives (eager)")
def _():
    t = torch.full((3,), float(R + 1), device=TPU)
    s = funcol.all_reduce(t, "sum", dist.group.WORLD)
    same(funcol.wait_tensor(s), torch.full((3,), 3.0), "funcol.all_reduce")
    g = funcol.all_gather_tensor(t, 0, dist.group.WORLD)
    same(g, torch.tensor([1.0, 1, 1, 2, 2, 2]), "funcol.all_gather_tensor")
    rs = funcol.reduce_scatter_tensor(torch.arange(4.0, device=TPU), "sum", 0, dist.group.WORLD)
    same(rs, torch.arange(4.0)[2 * R:2 * R + 2] * W, "funcol.reduce_scatter_tensor")
    a2a = funcol.all_to_all_single(torch.arange(4.0, device=TPU) + 10 * R, [2, 2], [2, 2], dist.group.WORLD)
    exp = torch.cat([torch.arange(4.0)[2 * R:2 * R + 2] + 10 * r for r in range(W)])
    same(a2a, exp, "funcol.all_to_all_single")


@check("torch.compile with functional collectives (they run between the programs)")
def _():
    def f(x):
        y = x * 2
        s = funcol.all_reduce(y, "sum", dist.group.WORLD)
        g = funcol.all_gather_tensor(s + 1, 0, dist.group.WORLD)
        return g.sum(0) * 3

    cf = torch.compile(f)
    for k in range(2):  # the second call runs the compiled variant again
        x = torch.arange(4.0, device=TPU) + R + k
        same(cf(x), f(x).cpu(), "compiled funcol == eager", exact=False)
        s_ = 2 * (torch.arange(4.0) * W + sum(range(W)) + W * k)
        exp = 3 * W * (s_ + 1).sum()
        same(cf(x), exp, "compiled funcol value", exact=False)


@check("subgroups (new_group, singleton groups, new_subgroups)")
def _():
    g = dist.new_group([0, 1])
    assert dist.get_backend(g) == "cpu:gloo,tpu:tpu_dist"
    t = torch.full((2,), float(R), device=TPU)
    dist.all_reduce(t, group=g)
    same(t, torch.full((2,), 1.0), "all_reduce on a new group")
    mine = [dist.new_group([r]) for r in range(W)][R]  # every rank creates every group
    t = torch.full((2,), float(R + 3), device=TPU)
    dist.all_reduce(t, group=mine)
    same(t, torch.full((2,), float(R + 3)), "all_reduce on a one-rank group")
    sub, _ = dist.new_subgroups(group_size=1)
    dist.all_reduce(t, group=sub)
    same(t, torch.full((2,), float(R + 3)), "new_subgroups")
    g2 = dist.new_group([0, 1], backend="tpu_dist")  # the name works on its own, for tpu tensors
    t = torch.ones(3, device=TPU)
    dist.all_reduce(t, group=g2)
    same(t, torch.full((3,), 2.0), "tpu_dist-only group")
    g3 = dist.new_group([0, 1], backend="tpu")  # also registered as "tpu"
    dist.all_reduce(t, group=g3)
    same(t, torch.full((3,), 4.0), "group with backend 'tpu'")


@check("object collectives (through the cpu gloo half)")
def _():
    objs = [None] * W
    dist.all_gather_object(objs, {"rank": R})
    assert objs == [{"rank": r} for r in range(W)], objs
    lst = [R * 10]
    dist.broadcast_object_list(lst, src=1)
    assert lst == [10], lst


@check("DeferAndFuse: pending ops run before the collective")
def _():
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        x = torch.arange(6.0, device=TPU)
        y = x * (R + 1) + 1  # deferred
        dist.all_reduce(y)
        z = y * 2  # deferred after the write-back
        c = torch.arange(6.0) * (R + 1) + 1
        dist.all_reduce(c)
        same(z, c * 2, "fused graph around a collective")


dist.destroy_process_group()
say("ALL PASSED")
