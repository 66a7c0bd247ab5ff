"""The device API of `tpu`, as a CUDA user would use it."""
import subprocess
import sys

import pytest
import torch


def test_device_basics():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    assert torch.tpu.get_device_name().startswith("PJRT cpu")
    x = torch.ones(3).tpu()
    assert x.is_tpu and x.device == torch.device("tpu", 0)
    assert torch.device("tpu").type == "tpu"
    m = torch.nn.Linear(2, 2).tpu()
    assert m.weight.device.type == "tpu"


def test_autoload_on_import_torch():
    # a fresh interpreter that only imports torch gets the tpu device
    code = "import torch; x = torch.ones(2, device='tpu'); print(x.device, torch.tpu.is_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "tpu:0 True"


def test_multiple_cpu_plugin_devices():
    code = (
        "import torch; assert torch.tpu.device_count() == 3\n"
        "a = torch.arange(4., device='tpu:2'); b = (a * 2).cpu(); assert b.tolist() == [0, 2, 4, 6]\n"
        "with torch.tpu.device(1):\n"
        "    assert torch.tpu.current_device() == 1\n"
        "    c = torch.ones(2, device='tpu'); assert c.device.index == 1\n"
        "try:\n"
        "    torch.ones(2, device='tpu:0') + torch.ones(2, device='tpu:1')\n"
        "except RuntimeError as e:\n"
        "    assert 'same device' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no error for mixed devices')\n"
        "print('ok')"
    )
    env = dict(**__import__("os").environ, TORCH_TPU_NUM_DEVICES="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_rng_reproducible_and_state_roundtrip():
    torch.tpu.manual_seed(1234)
    a = torch.rand(1000, device="tpu").cpu()
    state = torch.tpu.get_rng_state()
    b = torch.rand(1000, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    c = torch.rand(1000, device="tpu").cpu()
    torch.tpu.manual_seed(1234)
    d = torch.rand(1000, device="tpu").cpu()
    assert torch.equal(a, d)
    assert torch.equal(b, c)
    assert not torch.equal(a, b)
    assert torch.tpu.initial_seed() == 1234
    # distribution sanity: uniform mean/var, normal mean/std
    u = torch.rand(200_000, device="tpu")
    assert abs(u.mean().item() - 0.5) < 0.01 and 0.0 <= u.min().item() and u.max().item() < 1.0
    n = torch.randn(200_000, device="tpu")
    assert abs(n.mean().item()) < 0.01 and abs(n.std().item() - 1.0) < 0.01


def test_torch_manual_seed_seeds_tpu():
    torch.manual_seed(7)
    a = torch.randn(16, device="tpu").cpu()
    torch.manual_seed(7)
    b = torch.randn(16, device="tpu").cpu()
    assert torch.equal(a, b)


def test_streams_events_memory():
    s = torch.tpu.current_stream()
    with torch.tpu.stream(s):
        x = torch.ones(1000, device="tpu") * 2
    e0 = torch.tpu.Event(enable_timing=True)
    e0.record()
    y = x + 1
    e1 = torch.tpu.Event(enable_timing=True)
    e1.record()
    e1.synchronize()
    assert e0.elapsed_time(e1) >= 0
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    z = torch.empty(1 << 20, device="tpu")
    assert torch.tpu.memory_allocated() - before >= 4 << 20
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del z
    assert torch.tpu.memory_allocated() == before
    torch.tpu.empty_cache()
    assert "allocated_bytes.all.current" in torch.tpu.memory_stats()
    assert torch.tpu.is_bf16_supported()
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()
    assert y.sum().item() == 3000


def test_printing_and_tolist():
    x = torch.tensor([[1.5, -2.0], [3.0, 4.25]], device="tpu")
    assert repr(x) == "tensor([[ 1.5000, -2.0000],\n        [ 3.0000,  4.2500]], device='tpu:0')"
    assert x.tolist() == [[1.5, -2.0], [3.0, 4.25]]
    assert str(torch.tensor(3, device="tpu")) == "tensor(3, device='tpu:0')"
    assert float(x[1, 1]) == 4.25 and bool(x[0, 0] > 1)


def test_save_load_roundtrip(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).to("tpu")
    t = torch.arange(6.0, device="tpu").view(2, 3).t()  # a non-contiguous view
    path = tmp_path / "ckpt.pt"
    torch.save({"model": m.state_dict(), "t": t}, path)
    ck = torch.load(path)
    assert ck["t"].device.type == "tpu"
    assert torch.equal(ck["t"].cpu(), t.cpu())
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).to("tpu")
    m2.load_state_dict(ck["model"])
    x = torch.randn(5, 4, device="tpu")
    assert torch.equal(m(x).cpu(), m2(x).cpu())
    cpu = torch.load(path, map_location="cpu")
    assert cpu["t"].device.type == "cpu"


def test_metrics_count_compiles_and_cache_hits():
    import torch_tpu

    x = torch.randn(37, 5, device="tpu")
    torch_tpu.metrics.reset()
    for _ in range(3):
        y = x * 3.0 + 1.0
    y.cpu()
    m = torch_tpu.metrics.report()
    assert m["executions"] >= 6
    # the 2nd and 3rd iterations reuse both programs: from the trace cache (no
    # program text built) or, when it is off, from the text-keyed cache
    assert m["trace_hits"] + m["cache_hits"] >= 4
    assert m["d2h_transfers"] >= 1 and m["d2h_bytes"] >= 37 * 5 * 4


def test_changing_scalars_does_not_recompile():
    import torch_tpu

    p = torch.randn(64, device="tpu")
    g = torch.randn(64, device="tpu")
    p.add_(g, alpha=-0.1)
    torch_tpu.metrics.reset()
    for lr in (0.01, 0.02, 0.03, 0.04):
        p.add_(g, alpha=-lr)
        p.mul_(1 - lr)
    torch.tpu.synchronize()
    m = torch_tpu.metrics.report()
    assert m["compiles"] <= 1, m  # mul_ by a python float: at most its first compile


def test_a_normal_run_is_quiet():
    """No plugin log lines on stderr: importing, computing, compiling and exiting print nothing."""
    import subprocess
    import sys

    code = ("import torch\nx = torch.ones(3, device='tpu')\ny = (x * 2).sum().item()\n"
            "f = torch.compile(lambda t: t + 1)\nf(x).cpu()\nprint(y)")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "6.0"
    assert r.stderr == "", r.stderr


def test_module_to_moves_parameters_in_place(highest):
    """As with CUDA, Module.to("tpu") keeps each Parameter object (`param.data = moved`):
    tied weights stay tied (HF's embedding / LM head) and an optimizer built before the
    move updates the moved parameters. It used to make new Parameters on tpu."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied
    model = torch.nn.Sequential(emb, head)
    w = emb.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ref = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    ref[1].weight = ref[0].weight
    ref.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    model.to("tpu")
    assert emb.weight is w and head.weight is w and w.device.type == "tpu"
    assert len(list(model.parameters())) == 1
    ids = torch.tensor([[1, 2, 3]])
    for m, o, x in ((model, opt, ids.to("tpu")), (ref, ref_opt, ids)):
        m(x).logsumexp(-1).sum().backward()
        o.step()
    torch.testing.assert_close(w.cpu(), ref[0].weight.detach(), rtol=1e-5, atol=1e-6)
    model.to("cpu")
    assert emb.weight is w and w.device.type == "cpu"


def test_memory_figures_as_cuda_reports_them():
    """What TorchTitan's memory monitor and vLLM's profiler read: a total memory (the CPU plugin
    reports none of its own: its buffers are host memory, so the host's), mem_get_info, and
    memory_stats with CUDA's keys (TorchTitan divided by total_memory == 0)."""
    props = torch.tpu.get_device_properties(0)
    assert props.total_memory > 0 and props.name == torch.tpu.get_device_name(0)
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total and total == props.total_memory
    torch.tpu.reset_peak_memory_stats()
    z = torch.ones(1 << 20, device="tpu")
    z.sum().item()  # the buffer exists now
    s = torch.tpu.memory_stats()
    for k in ("active_bytes.all.peak", "active_bytes.all.current", "reserved_bytes.all.peak",
              "allocated_bytes.all.peak", "num_alloc_retries", "num_ooms"):
        assert k in s, k
    assert s["active_bytes.all.peak"] >= 4 << 20
    assert s["reserved_bytes.all.current"] >= 4 << 20 and torch.tpu.memory_reserved() >= 4 << 20
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()
    del z


def test_torch_accelerator_memory_calls():
    """torch.accelerator's device-generic memory calls (what vLLM's model loader calls:
    empty_cache, then empty_host_cache at shutdown) work on tpu as on cuda; they raised an
    internal assert ("Allocator for tpu is not a DeviceAllocator") and empty_host_cache crashed."""
    assert torch.accelerator.current_accelerator().type == "tpu"
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    z = torch.ones(1 << 18, device="tpu")
    assert torch.accelerator.memory_allocated() - base == 1 << 20
    assert torch.accelerator.max_memory_allocated() >= base + (1 << 20)
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.accelerator.memory_allocated()
    torch.accelerator.empty_cache()  # nothing cached: a no-op that must not raise
    torch.accelerator.empty_host_cache()
    free, total = torch.accelerator.get_memory_info()
    assert (free, total)[1] == torch.tpu.mem_get_info()[1] and 0 < free <= total
    del z
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()


def test_stream_context_is_reusable_and_sets_the_current_stream():
    """torch.tpu.stream(s) returns a StreamContext (as torch.cuda.stream does) that can be entered
    again and again (SGLang's scheduler keeps one and enters it per batch: a generator-based
    context manager failed on its second use), and current_stream() is `s` inside it."""
    assert torch.tpu.StreamContext is type(torch.tpu.stream(None))
    default = torch.tpu.current_stream()
    s = torch.tpu.Stream(priority=0)
    ctx = torch.tpu.stream(s)
    for _ in range(3):
        with ctx as entered:
            assert entered is s and torch.tpu.current_stream() is s
            with torch.tpu.stream(default):
                assert torch.tpu.current_stream() is default
            assert torch.tpu.current_stream() is s
        assert torch.tpu.current_stream() is default
    with torch.tpu.stream(None):
        assert torch.tpu.current_stream() is default


def test_one_process_rule_names_the_owner_and_frees_the_device_when_it_dies(tmp_path):
    # TORCH_TPU_EXCLUSIVE=1: what a Cloud TPU enforces (one process opens its chips), on any
    # plugin. A second process gets an error naming the owner (not a hang, not a second client);
    # the owner killed, the device is free again.
    import os
    import signal
    env = dict(os.environ, TORCH_TPU_EXCLUSIVE="1", XDG_RUNTIME_DIR=str(tmp_path))
    owner = subprocess.Popen(
        [sys.executable, "-c", "import torch, time; torch.ones(2, device='tpu'); print('up', flush=True); time.sleep(120)"],
        env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        probe = ("import torch\n"
                 "try:\n    torch.ones(2, device='tpu')\nexcept RuntimeError as e:\n    print('ERR', e)\n"
                 "print('available', torch.tpu.is_available())\n")
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert f"in use by process {owner.pid}" in out.stdout, out.stdout + out.stderr[-2000:]
        assert "available False" in out.stdout
        # without the switch the devices are shared, as before
        shared = subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(2, device='tpu').sum().item())"],
                                env=dict(env, TORCH_TPU_EXCLUSIVE="0"), capture_output=True, text=True, timeout=120)
        assert shared.stdout.strip() == "2.0", shared.stderr[-2000:]
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    again = subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(2, device='tpu').sum().item())"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert again.stdout.strip() == "2.0", again.stderr[-2000:]
