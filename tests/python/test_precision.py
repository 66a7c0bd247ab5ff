"""Matmul precision modes: error classes against a float64 reference, ordering,
switching, gradients, and isolation from CPU and low-precision dtypes."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu

P = torch.tpu.Precision
SHAPES = [(64, 64, 64), (128, 256, 32), (17, 300, 9)]


def rel_err(actual, ref):
    return ((actual.double() - ref).norm() / ref.norm()).item()


def mm_err(mode, m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(k, n, generator=g)
    ref = a.double() @ b.double()
    with torch.tpu.precision(mode):
        c = (a.to("tpu") @ b.to("tpu")).cpu()
    return rel_err(c, ref)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_error_classes_and_ordering(m, k, n):
    d, h, hh = (mm_err(p, m, k, n, 0) for p in (P.DEFAULT, P.HIGH, P.HIGHEST))
    assert 2 ** -12 < d < 2 ** -6, d          # bf16 class (2^-8 nominal)
    assert h < 2 ** -14, h                    # near 2^-16 or better
    assert hh < 2 ** -19, hh                  # float32 class
    assert d > h > hh
    cpu = torch.randn(m, k, dtype=torch.float64)  # a float32 CPU matmul stays float32-accurate
    ref = cpu @ cpu.t()
    assert rel_err((cpu.float() @ cpu.float().t()), ref) < 2 ** -19


def test_default_is_default_and_context_nests():
    assert torch.tpu.get_matmul_precision() == P.DEFAULT
    torch.tpu.set_matmul_precision(P.HIGH)  # process-wide
    assert torch.tpu.get_matmul_precision() == P.HIGH
    with torch.tpu.precision(P.DEFAULT):
        assert torch.tpu.get_matmul_precision() == P.DEFAULT
    assert torch.tpu.get_matmul_precision() == P.HIGH
    torch.tpu.set_matmul_precision(P.DEFAULT)
    with torch.tpu.precision(P.HIGH):
        assert torch.tpu.get_matmul_precision() == P.HIGH
        with torch.tpu.precision(P.HIGHEST):
            assert torch.tpu.get_matmul_precision() == P.HIGHEST
        assert torch.tpu.get_matmul_precision() == P.HIGH
    assert torch.tpu.get_matmul_precision() == P.DEFAULT


def test_modes_by_name():
    with torch.tpu.precision("highest"):
        assert torch.tpu.get_matmul_precision() == P.HIGHEST
        with torch.tpu.precision("High"):
            assert torch.tpu.get_matmul_precision() == P.HIGH
    torch.tpu.set_matmul_precision("high")
    try:
        assert torch.tpu.get_matmul_precision() == P.HIGH
    finally:
        torch.tpu.set_matmul_precision("default")
    assert torch.tpu.get_matmul_precision() == P.DEFAULT
    with pytest.raises(ValueError, match="unknown matmul precision 'medium'"):
        torch.tpu.set_matmul_precision("medium")
    with pytest.raises(ValueError):
        torch.tpu.set_matmul_precision(7)


def test_switching_recompiles_and_changes_numbers():
    a = torch.randn(32, 32, device="tpu")
    b = torch.randn(32, 32, device="tpu")
    x0 = (a @ b).cpu()
    torch_tpu.metrics.reset()
    with torch.tpu.precision(P.HIGHEST):
        x1 = (a @ b).cpu()
    assert torch_tpu.metrics.report()["compiles"] >= 1
    assert not torch.equal(x0, x1)
    x2 = (a @ b).cpu()  # back to DEFAULT: the cached DEFAULT program
    assert torch.equal(x0, x2)


def test_gradients_follow_the_mode():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(48, 40, generator=g)
    w = torch.randn(40, 24, generator=g)
    a64 = a.double().requires_grad_(True)
    (a64 @ w.double()).pow(2).sum().backward()
    errs = []
    for mode in (P.DEFAULT, P.HIGHEST):
        at = a.to("tpu").requires_grad_(True)
        with torch.tpu.precision(mode):
            (at @ w.to("tpu")).pow(2).sum().backward()
        errs.append(rel_err(at.grad.cpu(), a64.grad))
    assert errs[0] > 2 ** -12 and errs[1] < 2 ** -18, errs


def test_low_precision_inputs_ignore_the_mode():
    a = torch.randn(32, 32, dtype=torch.bfloat16, device="tpu")
    b = torch.randn(32, 32, dtype=torch.bfloat16, device="tpu")
    outs = []
    for mode in P:
        with torch.tpu.precision(mode):
            outs.append((a @ b).cpu())
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    ref = (a.cpu().float() @ b.cpu().float()).bfloat16()
    torch.testing.assert_close(outs[0], ref, rtol=1e-2, atol=1e-2)


def test_conv_follows_the_mode():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 12, 12, generator=g)
    w = torch.randn(6, 8, 3, 3, generator=g)
    ref = F.conv2d(x.double(), w.double(), padding=1)
    errs = []
    for mode in (P.DEFAULT, P.HIGH, P.HIGHEST):
        with torch.tpu.precision(mode):
            errs.append(rel_err(F.conv2d(x.to("tpu"), w.to("tpu"), padding=1).cpu(), ref))
    assert errs[0] > errs[1] > errs[2] and errs[2] < 2 ** -19, errs


def test_torch_set_float32_matmul_precision_maps_to_tpu_only():
    # tpu reads ATen's setting; torch's setter is torch's own, not wrapped
    assert torch.set_float32_matmul_precision.__module__ == "torch"
    assert not hasattr(torch.set_float32_matmul_precision, "_tpu")
    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert torch.tpu.get_matmul_precision() == P.HIGH
        assert torch.get_float32_matmul_precision() == "high"  # CPU/CUDA meaning unchanged
        torch.set_float32_matmul_precision("highest")
        assert torch.tpu.get_matmul_precision() == P.HIGHEST
        torch.set_float32_matmul_precision("medium")
        assert torch.tpu.get_matmul_precision() == P.DEFAULT
        # whichever was set last applies: torch.tpu's setter, then ATen's again
        torch.set_float32_matmul_precision("highest")
        torch.tpu.set_matmul_precision(P.HIGH)
        assert torch.tpu.get_matmul_precision() == P.HIGH
        assert torch.get_float32_matmul_precision() == "highest"
        # ATen's value unchanged since torch.tpu's call: that call stays the later one (a documented limit)
        assert torch.tpu.get_matmul_precision() == P.HIGH
        torch.set_float32_matmul_precision("medium")
        assert torch.tpu.get_matmul_precision() == P.DEFAULT
    finally:
        torch.set_float32_matmul_precision(prev)
        torch.tpu.set_matmul_precision(P.DEFAULT)


def test_aten_precision_reaches_the_lowering():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    ref = a.double() @ b.double()
    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        lo = rel_err((a.to("tpu") @ b.to("tpu")).cpu(), ref)
        torch.set_float32_matmul_precision("highest")
        hi = rel_err((a.to("tpu") @ b.to("tpu")).cpu(), ref)
    finally:
        torch.set_float32_matmul_precision(prev)
        torch.tpu.set_matmul_precision(P.DEFAULT)
    assert hi < 2 ** -19 < lo, (hi, lo)


def test_precision_context_is_thread_local_and_reaches_backward():
    import threading

    seen = {}

    def worker():
        seen["other"] = torch.tpu.get_matmul_precision()
        a = torch.randn(16, 16, device="tpu")
        seen["value"] = (a @ a).cpu()

    with torch.tpu.precision(P.HIGHEST):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert torch.tpu.get_matmul_precision() == P.HIGHEST
    assert seen["other"] == P.DEFAULT
    # the backward (run by autograd on another thread) follows the context it was started in
    g = torch.Generator().manual_seed(3)
    a = torch.randn(32, 32, generator=g)
    a64 = a.double().requires_grad_(True)
    (a64 @ a64).sum().backward()
    at = a.to("tpu").requires_grad_(True)
    with torch.tpu.precision(P.HIGHEST):
        (at @ at.detach()).sum().backward()
    a64b = a.double().requires_grad_(True)
    (a64b @ a.double()).sum().backward()
    assert rel_err(at.grad.cpu(), a64b.grad) < 2 ** -19
