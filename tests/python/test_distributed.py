"""torch.distributed on tpu: the c10d backend tpu_dist (csrc/aten/distributed/distributed.cpp).

The multi-rank tests launch 2 ranks with torchrun, as users do, running the scripts in
tests/python/scripts/dist_*.py; each script compares tpu against the same program on CPU
tensors over gloo (and against one process where it trains). Every launch has a
timeout that kills the whole job, so a hang fails the test instead of blocking CI.
"""
import os
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import torch_tpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def torchrun(script, *args, nproc=2, timeout=180, env=None):
    """Runs `torchrun --standalone --nproc_per_node=nproc script args`; returns its output."""
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("TORCH_TPU_NUM_DEVICES", None)  # under torchrun: one tpu device per local rank
    e.update(env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", script, *args]
    p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the launcher and its ranks
        out, _ = p.communicate()
        pytest.fail(f"{os.path.basename(script)} did not finish within {timeout}s:\n{out[-6000:]}")
    assert p.returncode == 0, f"{os.path.basename(script)} failed (exit {p.returncode}):\n{out[-8000:]}"
    assert "terminate called" not in out and "Aborted" not in out, out[-4000:]
    return out


def passes(out):
    return [line.split(" | ")[0] for line in out.splitlines() if line.startswith("PASS ")]


# ---------------------------------------------------------------- in this process
def test_backend_registered_for_tpu():
    assert "tpu_dist" in dist.Backend.backend_list and "tpu" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_dist"
    assert dist.Backend.backend_capability["tpu_dist"] == ["tpu"]
    assert torch_tpu.distributed.is_registered()


def test_single_rank_group(tmp_path):
    """world_size 1 in this process: init without a backend, collectives, async work, destroy."""
    dist.init_process_group(init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert dist.get_backend() == "cpu:gloo,tpu:tpu_dist"
        t = torch.arange(4.0, device="tpu")
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), torch.arange(4.0))
        w = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
        w.wait()
        assert w.is_completed() and torch.equal(w.get_future().value()[0].cpu(), torch.arange(4.0))
        out = torch.empty(4, device="tpu")
        dist.all_gather_into_tensor(out, t * 2)
        assert torch.equal(out.cpu(), torch.arange(4.0) * 2)
        tpu_only = dist.new_group([0], backend="tpu_dist")
        with pytest.raises(RuntimeError, match="ReduceOp.AVG needs a floating-point tensor"):
            dist.all_reduce(torch.ones(2, dtype=torch.int64, device="tpu"), op=dist.ReduceOp.AVG, group=tpu_only)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_ddp_records_its_iteration_times_on_tpu(tmp_path):
    """DDP's logging data has forward / backward / communication times for a tpu module (the
    c10d reducer timer registered for PrivateUse1); without one DDP warns on every rank that it
    times CPU and CUDA only."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("tpu_dist", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = DDP(torch.nn.Linear(4, 4).to("tpu"))
        for _ in range(12):  # DDP samples its times at iteration 10
            model(torch.randn(2, 4, device="tpu")).sum().backward()
        data = model._get_ddp_logging_data()
        for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
            assert data.get(key, 0) > 0, (key, data)
        assert data["forward_compute_time_start"] < data["backward_compute_time_start"]
    finally:
        dist.destroy_process_group()


def test_storage_resize(tpu):
    """untyped_storage().resize_ (FSDP2 frees and re-allocates parameter memory with it)."""
    t = torch.arange(10, dtype=torch.float32, device=tpu)
    s = t.untyped_storage()
    before = torch.tpu.memory_allocated()
    s.resize_(0)
    assert s.nbytes() == 0 and torch.tpu.memory_allocated() == before - 40
    s.resize_(40)  # fresh memory reads as zeros
    assert torch.equal(t.cpu(), torch.zeros(10))
    t.copy_(torch.arange(10.0))
    s.resize_(80)  # growing keeps the old bytes
    grown = torch.empty(0, device=tpu).set_(s, 0, (20,), (1,))
    assert torch.equal(grown.cpu(), torch.cat([torch.arange(10.0), torch.zeros(10)]))
    s.resize_(20)  # shrinking keeps the prefix
    assert torch.equal(torch.empty(0, device=tpu).set_(s, 0, (5,), (1,)).cpu(), torch.arange(5.0))
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):  # a pending write survives the resize
        w = torch.ones(4, device=tpu) * 3
        w.untyped_storage().resize_(32)
        both = torch.empty(0, device=tpu).set_(w.untyped_storage(), 0, (8,), (1,))
        assert torch.equal(both.cpu(), torch.tensor([3.0, 3, 3, 3, 0, 0, 0, 0]))


def test_devices_per_process_under_torchrun():
    """torchrun sets LOCAL_WORLD_SIZE: every process gets that many CPU-plugin devices,
    so tpu:{local_rank} exists as cuda:{local_rank} does."""
    e = dict(os.environ, PYTHONPATH=ROOT, LOCAL_WORLD_SIZE="3")
    e.pop("TORCH_TPU_NUM_DEVICES", None)
    code = "import torch; torch.tpu.set_device(2); print(torch.tpu.device_count(), torch.ones(1, device='tpu:2').device)"
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "tpu:2"], out.stdout


# ---------------------------------------------------------------- 2 ranks under torchrun
def test_collectives_match_gloo_on_cpu():
    out = torchrun(os.path.join(SCRIPTS, "dist_collectives.py"))
    assert out.count("ALL PASSED") == 2, out[-4000:]
    names = set(passes(out))
    for name in ("broadcast", "all_reduce ops and dtypes", "all_to_all_single (even, uneven splits), all_to_all",
                 "send/recv, isend/irecv, batch_isend_irecv, recv from any source",
                 "async_op Work: wait, is_completed, futures, ordering",
                 "subgroups (new_group, singleton groups, new_subgroups)"):
        assert "PASS " + name in names, (name, names)


def test_bad_input_raises_within_timeout():
    out = torchrun(os.path.join(SCRIPTS, "dist_errors.py"), timeout=120)
    assert out.count("ALL PASSED") == 2, out[-4000:]
    names = passes(out)
    assert names.count("PASS all_reduce with different sizes") == 2  # both ranks raise
    assert "PASS a collective rank 1 never joins" in names
    assert "PASS recv into a tensor of the wrong size" in names


def test_ddp_fsdp2_dtensor_checkpoint():
    out = torchrun(os.path.join(SCRIPTS, "dist_train.py"))
    assert out.count("ALL PASSED") == 2, out[-4000:]
    names = set(passes(out))
    for name in ("PASS DDP on tpu == one process on the full batch",
                 "PASS DDP on tpu (tpu_dist) == DDP on cpu (gloo)",
                 "PASS FSDP2 reshard_after_forward=True full state dict == DDP's",
                 "PASS FSDP2 reshard_after_forward=False full state dict == DDP's",
                 "PASS FSDP2 on tpu == FSDP2 on cpu (gloo)",
                 "PASS DTensor redistributions on tpu == on cpu (gloo)",
                 "PASS DCP save/load of a sharded model"):
        assert name in names, (name, names)


@pytest.mark.parametrize("mode", ["strict", "fuse"])
def test_train_ddp_example(mode):
    """examples/train_ddp.py, an NCCL-style DDP script, matches one process on the full batch."""
    env = {"TORCH_TPU_DEFER_AND_FUSE": "1"} if mode == "fuse" else {}
    out = torchrun(os.path.join(ROOT, "examples", "train_ddp.py"), "--steps", "3", "--opt", "sgd", "--lr", "0.1",
                   "--check", env=env)
    assert out.count("CHECK OK") == 2, out[-4000:]


# ---------------------------------------------------------------- in-program collectives (one process)
def test_in_program_collectives_on_two_devices():
    """torch_tpu.spmd: functional collectives lowered to StableHLO collectives with
    replica groups, one program for 2 replicas on tpu:0 and tpu:1 of one process."""
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TORCH_TPU_NUM_DEVICES="2")
    p = subprocess.run([sys.executable, os.path.join(SCRIPTS, "spmd_collectives.py")], env=e, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "ALL PASSED" in p.stdout
    assert "PASS functional collectives lowered into one replicated program" in p.stdout
    assert "PASS dynamic inputs" in p.stdout
