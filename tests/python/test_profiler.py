"""torch.profiler shows tpu work: compiles (with program size), program runs, host
transfers and flushes as `tpu::*` events with durations; a long first run of compiles
prints one progress line."""
import json
import os
import subprocess
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import torch_tpu

TPU_EVENTS = {"tpu::compile", "tpu::load_program", "tpu::execute", "tpu::copy_to_device", "tpu::copy_to_host",
              "tpu::flush"}


def _train_step(model, opt, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def test_profiler_records_tpu_work(tmp_path):
    torch.manual_seed(0)
    # a width no other test uses, so this run compiles (or loads) its programs
    model = torch.nn.Sequential(torch.nn.Linear(37, 29), torch.nn.ReLU(), torch.nn.Linear(29, 5)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(11, 37), torch.randint(0, 5, (11,))
    # record_shapes: sizes (bytes, ops) are recorded as the events' keyword inputs
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], record_shapes=True) as prof:
        _train_step(model, opt, x.to("tpu"), y.to("tpu"))
    events = {e.key: e for e in prof.key_averages()}
    for name in ("tpu::execute", "tpu::flush", "tpu::copy_to_device", "tpu::copy_to_host"):
        assert name in events, sorted(k for k in events if k.startswith("tpu::"))
        assert events[name].count >= 1
        assert events[name].cpu_time_total > 0
    assert "tpu::compile" in events or "tpu::load_program" in events
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=200)
    assert "tpu::execute" in table

    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = [e for e in json.loads(path.read_text())["traceEvents"] if str(e.get("name", "")).startswith("tpu::")]
    assert {e["name"] for e in trace} <= TPU_EVENTS
    for e in trace:
        assert e["dur"] >= 0
        if e["name"] in ("tpu::compile", "tpu::load_program", "tpu::copy_to_device", "tpu::copy_to_host"):
            assert e["args"]["bytes"] > 0, e
    uploads = [e for e in trace if e["name"] == "tpu::copy_to_device"]
    assert any(e["args"]["bytes"] == 11 * 37 * 4 for e in uploads), uploads  # x's upload
    flushes = [e for e in trace if e["name"] == "tpu::flush"]
    assert all(e["args"]["ops"] >= 1 for e in flushes)


def test_profiling_inside_fused_mode_counts_the_graph_ops():
    x = torch.randn(16, 16, device="tpu")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
            y = torch.tanh(x * 3 + 1).relu().sum()
            y.item()
    flushes = [e for e in prof.events() if e.name == "tpu::flush"]
    assert flushes
    assert max(e.kwinputs.get("ops", 0) for e in flushes) >= 4  # mul, add, tanh, relu, sum in one graph


def test_no_events_and_no_cost_when_not_profiling():
    x = torch.randn(8, device="tpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pass
    (x + 1).cpu()
    assert not [e for e in prof.events() if e.name.startswith("tpu::")]


def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)


_MANY_PROGRAMS = ("import torch\nx = torch.randn(8, 8, device='tpu')\n"
                  "for i in range(1, 30):\n"
                  "    x = torch.tanh(x * i) + x[: (i % 7) + 1].sum(0)\n"
                  "print(float(x.sum()))\n")


def test_a_long_run_of_compiles_prints_one_progress_line(tmp_path):
    r = _run(_MANY_PROGRAMS, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"), TORCH_TPU_COMPILE_PROGRESS="0.01")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("torch_tpu: compiling programs for new shapes: ")
    assert " so far, " in lines[0]
    # off
    r = _run(_MANY_PROGRAMS, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache2"), TORCH_TPU_COMPILE_PROGRESS="0")
    assert r.returncode == 0 and r.stderr == "", r.stderr
