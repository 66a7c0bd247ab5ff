"""A script written for "cuda", run with only the device string changed."""
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "cuda_style_train.py")


def run(device, dropout, steps, **env):
    e = dict(os.environ, **env)
    out = subprocess.run([sys.executable, SCRIPT, device, str(dropout), str(steps)], capture_output=True, text=True,
                         env=e, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    losses = [float(l.split()[1]) for l in lines if l.startswith("loss ")]
    assert len(losses) == steps
    assert "reload_equal True" in lines
    return losses, lines


def test_losses_match_cpu_without_dropout():
    # HIGHEST precision: float32-class matmuls, so the losses track CPU closely.
    cpu, _ = run("cpu", 0.0, 10)
    tpu, _ = run("tpu", 0.0, 10, TORCH_TPU_MATMUL_PRECISION="highest")
    for c, t in zip(cpu, tpu):
        assert abs(c - t) <= 1e-3 * max(1.0, abs(c)), (cpu, tpu)
    assert tpu[-1] < tpu[0] * 0.9


def test_losses_match_cpu_default_precision_within_bf16_tolerance():
    cpu, _ = run("cpu", 0.0, 10)
    tpu, _ = run("tpu", 0.0, 10)
    for c, t in zip(cpu, tpu):
        assert abs(c - t) <= 3e-2 * max(1.0, abs(c)), (cpu, tpu)


def test_dropout_training_is_reproducible_and_learns():
    a, _ = run("tpu", 0.1, 10)
    b, _ = run("tpu", 0.1, 10)
    assert a == b
    assert a[-1] < a[0]
