"""DDP, FSDP2 (fully_shard), DTensor and torch.distributed.checkpoint on tpu under
torchrun (2 ranks), against one process on the full batch and against the same
programs on CPU tensors over gloo. Run by test_distributed.py.

Model: examples/train_gpt.py's GPT (dropout 0), SGD with momentum, 3 steps; each rank trains on
its half of the same global batch. Prints "PASS <name>" per check, "ALL PASSED" at the end.
"""
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_tpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples"))
from train_gpt import GPT, CharData, make_corpus  # noqa: E402

torch.set_float32_matmul_precision("highest")  # float32 matmuls on tpu, comparable with CPU
LOCAL = int(os.environ["LOCAL_RANK"])
torch.tpu.set_device(LOCAL)
TPU = torch.device("tpu", LOCAL)
MESH = init_device_mesh("tpu", (2,))  # initializes the default group: cpu:gloo,tpu:tpu_dist
R, W = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "cpu:gloo,tpu:tpu_dist", dist.get_backend()
CPU_MESH = init_device_mesh("cpu", (2,))

DATA = CharData(make_corpus(300), 16, "cpu")
_gen = torch.Generator().manual_seed(0)
BATCHES = [DATA.batch(8, _gen) for _ in range(3)]


def make(device, seed=0):
    torch.manual_seed(seed)
    return GPT(DATA.vocab, d=32, layers=2, heads=4, block=16, dropout=0.0).to(device)


def train(model, device, shard=True):
    # SGD with momentum, not AdamW: the attention's key bias has a zero gradient up to
    # rounding noise, which Adam's normalisation blows up to lr-sized steps (3e-4 apart
    # between a 2-rank and a 1-process run), hiding real differences.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in BATCHES:
        if shard:
            x, y = x.chunk(W)[R], y.chunk(W)[R]
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def full_state(model):
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in model.state_dict().items()}


def say(line):
    os.write(1, (line + "\n").encode())  # one write: the ranks share the launcher's stdout


def compare(a, b, name, atol=2e-5, rtol=1e-5):
    assert a.keys() == b.keys(), (name, a.keys() ^ b.keys())
    worst = 0.0
    for k in a:
        worst = max(worst, (a[k].float() - b[k].float()).abs().max().item())
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol, msg=lambda m: f"{name} {k}: {m}")
    say(f"PASS {name} | max abs difference {worst:.3g}")


# ---------------------------------------------------------------- DDP
ref_model = make(TPU)
ref_losses = train(ref_model, TPU, shard=False)  # one process, full batch
REF = full_state(ref_model)
torch_tpu.metrics.reset()
ddp = DDP(make(TPU), device_ids=[LOCAL])
ddp_losses = train(ddp, TPU)
fallbacks = torch_tpu.metrics.cpu_fallbacks()
DDP_STATE = full_state(ddp.module)
compare(DDP_STATE, REF, "DDP on tpu == one process on the full batch")
assert fallbacks == {}, f"DDP ran ops on the CPU fallback: {fallbacks}"
cpu_ddp = DDP(make("cpu"))
train(cpu_ddp, "cpu")
compare(DDP_STATE, full_state(cpu_ddp.module), "DDP on tpu (tpu_dist) == DDP on cpu (gloo)")
# the local loss of the full batch's halves average to the full batch's loss
mean = torch.tensor(ddp_losses, device=TPU)
dist.all_reduce(mean, op=dist.ReduceOp.AVG)
torch.testing.assert_close(mean.cpu(), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
say("PASS DDP losses == one process")


# ---------------------------------------------------------------- FSDP2
def fsdp_model(device, mesh, reshard, seed=0):
    m = make(device, seed)
    for blk in m.blocks:
        fully_shard(blk, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    return m


FSDP_MODELS = {}
for reshard in (True, False):
    torch_tpu.metrics.reset()
    m = fsdp_model(TPU, MESH, reshard)
    losses = train(m, TPU)
    fb = torch_tpu.metrics.cpu_fallbacks()
    assert fb == {}, f"FSDP2 ran ops on the CPU fallback: {fb}"
    local = m.blocks[0].attn.qkv.weight
    assert isinstance(local, DTensor) and local.to_local().shape[0] == 3 * 32 // W, local
    compare(full_state(m), DDP_STATE, f"FSDP2 reshard_after_forward={reshard} full state dict == DDP's")
    full = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if R == 0:  # rank 0 holds the full CPU state dict
        compare({k: v.cpu() for k, v in full.items()}, DDP_STATE, "get_model_state_dict(full_state_dict=True)")
    FSDP_MODELS[reshard] = m

# the same FSDP2 program on CPU tensors over gloo (gloo has no ReduceOp.AVG: FSDP2's CPU
# path needs sum reduction, which set_force_sum_reduction_for_comms gives)
cpu_fsdp = fsdp_model("cpu", CPU_MESH, True)
cpu_fsdp.set_force_sum_reduction_for_comms(True)
train(cpu_fsdp, "cpu")
compare(full_state(FSDP_MODELS[True]), full_state(cpu_fsdp), "FSDP2 on tpu == FSDP2 on cpu (gloo)")


# ---------------------------------------------------------------- DTensor
def dtensor_program(device, mesh):
    """Redistributions and an op on sharded tensors; returns local shards and full tensors."""
    torch.manual_seed(3)
    full = torch.randn(4, 6).to(device)
    other = torch.randn(6, 5).to(device)
    out = {}
    s0 = distribute_tensor(full, mesh, [Shard(0)])
    out["shard0.local"] = s0.to_local()
    out["shard0->replicate"] = s0.redistribute(mesh, [Replicate()]).to_local()
    out["shard0->shard1"] = s0.redistribute(mesh, [Shard(1)]).to_local()
    out["shard1.full_tensor"] = s0.redistribute(mesh, [Shard(1)]).full_tensor()
    part = DTensor.from_local(full * (R + 1), mesh, [Partial()])
    out["partial->replicate"] = part.redistribute(mesh, [Replicate()]).to_local()
    out["partial->shard0"] = part.redistribute(mesh, [Shard(0)]).to_local()
    out["partial->shard1"] = part.redistribute(mesh, [Shard(1)]).to_local()
    avg = DTensor.from_local(full * (R + 1), mesh, [Partial("avg")])
    out["partial(avg)->replicate"] = avg.redistribute(mesh, [Replicate()]).to_local()
    rep = distribute_tensor(other, mesh, [Replicate()])
    out["mm(shard0, replicate).full_tensor"] = torch.mm(s0, rep).full_tensor()
    out["sum(shard0).full_tensor"] = s0.sum().full_tensor()
    return {k: v.detach().cpu() for k, v in out.items()}, full.cpu()


tpu_out, full = dtensor_program(TPU, MESH)
cpu_out, _ = dtensor_program("cpu", CPU_MESH)
compare(tpu_out, cpu_out, "DTensor redistributions on tpu == on cpu (gloo)", atol=1e-5)
expect = {
    "shard0->replicate": full,
    "shard0->shard1": full.chunk(W, 1)[R],
    "shard1.full_tensor": full,
    "partial->replicate": full * 3,
    "partial->shard0": (full * 3).chunk(W, 0)[R],
    "partial(avg)->replicate": full * 1.5,
}
compare({k: tpu_out[k] for k in expect}, expect, "DTensor redistributions == their definitions", atol=1e-6)


# ---------------------------------------------------------------- distributed checkpoint
path = [tempfile.mkdtemp(prefix="tpu_dcp_") if R == 0 else None]
dist.broadcast_object_list(path, src=0)
path = path[0]
try:
    src = FSDP_MODELS[True]
    dcp.save({"model": src.state_dict()}, checkpoint_id=path)
    dst = fsdp_model(TPU, MESH, True, seed=1)  # other initial values
    assert not torch.equal(full_state(dst)["head.weight"], full_state(src)["head.weight"])
    sd = {"model": dst.state_dict()}
    dcp.load(sd, checkpoint_id=path)
    dst.load_state_dict(sd["model"])
    compare(full_state(dst), full_state(src), "DCP save/load of a sharded model", atol=0, rtol=0)
    plain = make(TPU, seed=2)  # resharding on load: a non-sharded model reads the same checkpoint
    sd = {"model": plain.state_dict()}
    dcp.load(sd, checkpoint_id=path)
    plain.load_state_dict(sd["model"])
    compare(full_state(plain), full_state(src), "DCP load of the sharded checkpoint into a plain tpu model", atol=0, rtol=0)
finally:
    dist.barrier()
    if R == 0:
        shutil.rmtree(path, ignore_errors=True)

dist.destroy_process_group()
say("ALL PASSED")
