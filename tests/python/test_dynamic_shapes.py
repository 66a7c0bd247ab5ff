"""Data-dependent output shapes (nonzero, masked_select, boolean-mask indexing,
unique) are computed on the device: the count is read back, the result is built
on the device. No CPU fallback may happen (warnings are errors here)."""

import pytest
import torch

import torch_tpu

E = torch_tpu.EagerMode


@pytest.fixture(autouse=True)
def _no_fallback(no_fallback):
    yield


def sparse(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) > 0.6).float() * torch.randn(shape, generator=g)


SHAPES = [(), (1,), (9,), (3, 4), (2, 3, 4), (0, 3)]


@pytest.mark.parametrize("mode", [E.DEFER_NEVER, E.DEFER_AND_FUSE], ids=["strict", "fuse"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_nonzero_masked_select_argwhere(shape, mode):
    x = sparse(shape)
    xt = x.to("tpu")
    with torch_tpu.eager_mode(mode):
        assert torch.equal(torch.nonzero(xt).cpu(), torch.nonzero(x))
        assert torch.equal(torch.argwhere(xt).cpu(), torch.argwhere(x))
        got, want = torch.nonzero(xt, as_tuple=True), torch.nonzero(x, as_tuple=True)
        assert len(got) == len(want) and all(torch.equal(a.cpu(), b) for a, b in zip(got, want))
        m = x > 0
        assert torch.equal(torch.masked_select(xt, m.to("tpu")).cpu(), torch.masked_select(x, m))
        for size in (0, 2, 50):
            assert torch.equal(torch.nonzero_static(xt, size=size, fill_value=-3).cpu(),
                               torch.nonzero_static(x, size=size, fill_value=-3))


def test_masked_select_broadcasts():
    x, m = torch.randn(3, 1, 4), torch.randn(5, 1) > 0
    assert torch.equal(torch.masked_select(x.to("tpu"), m.to("tpu")).cpu(), torch.masked_select(x, m))


@pytest.mark.parametrize("mode", [E.DEFER_NEVER, E.DEFER_AND_FUSE], ids=["strict", "fuse"])
def test_boolean_mask_indexing_read_write_and_grad(mode):
    x = torch.randn(4, 5, 3)
    m2 = torch.randn(4, 5) > 0
    m1 = torch.tensor([True, False, True, True, False])
    xt = x.to("tpu")
    with torch_tpu.eager_mode(mode):
        assert torch.equal(xt[m2.to("tpu")].cpu(), x[m2])
        assert torch.equal(xt[:, m1.to("tpu")].cpu(), x[:, m1])
        assert torch.equal(xt[m2].cpu(), x[m2])  # a CPU mask, as with CUDA tensors
        y, yt = x.clone(), xt.clone()
        y[m2] = 0.5
        yt[m2.to("tpu")] = 0.5
        assert torch.equal(yt.cpu(), y)
        y[x > 0] += 1
        yt[xt > 0] += 1
        assert torch.equal(yt.cpu(), y)
        w = x.clone().requires_grad_()
        wt = xt.clone().requires_grad_()
        (w[m2] ** 2).sum().backward()
        (wt[m2.to("tpu")] ** 2).sum().backward()
        assert torch.equal(wt.grad.cpu(), w.grad)


def test_mask_shape_mismatch_raises_cpu_error():
    x = torch.randn(3, 4)
    with pytest.raises(IndexError) as cpu:
        x[torch.ones(2, dtype=torch.bool)]
    with pytest.raises(IndexError) as tpu:
        x.to("tpu")[torch.ones(2, dtype=torch.bool, device="tpu")]
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_unique_and_unique_consecutive(dtype):
    x = torch.randint(-3, 4, (5, 7)).to(dtype)
    xt = x.to("tpu")
    for kw in [{}, {"return_inverse": True}, {"return_counts": True}, {"return_inverse": True, "return_counts": True}]:
        for f in (torch.unique, torch.unique_consecutive):
            a, b = f(x, **kw), f(xt, **kw)
            a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
            for u, v in zip(a, b):
                assert torch.equal(v.cpu(), u), (f, kw)
    assert torch.equal(torch.unique(xt[:0]).cpu(), torch.unique(x[:0]))


def test_masked_scatter_and_its_gradient():
    x, m = torch.randn(4, 5), torch.randn(4, 5) > 0
    src = torch.randn(25, requires_grad=True)
    srct = src.detach().to("tpu").requires_grad_()
    a = x.masked_scatter(m, src)
    b = x.to("tpu").masked_scatter(m.to("tpu"), srct)
    assert torch.equal(b.detach().cpu(), a.detach())
    wgt = torch.arange(20.0).view(4, 5)
    (a * wgt).sum().backward()
    (b * wgt.to("tpu")).sum().backward()
    assert torch.equal(srct.grad.cpu(), src.grad)


def test_equal():
    x = torch.randn(3, 4, device="tpu")
    assert torch.equal(x, x.clone())
    assert not torch.equal(x, x + 1)
    assert not torch.equal(x, x[:2])
    assert torch.equal(torch.tensor([1.0, 2.0], device="tpu"), torch.tensor([1, 2], device="tpu"))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_with_tensor_repeats(no_fallback, dtype):
    """repeat_interleave with a repeats tensor (FastSpeech2's length regulator) runs on the
    device: the total is the one host read (none with output_size). It used to fall back."""
    for r in ([2, 0, 3, 1], [0, 0], [5]):
        rr = torch.tensor(r, dtype=dtype)
        got = torch.repeat_interleave(rr.to("tpu"))
        assert got.dtype == dtype and torch.equal(got.cpu(), torch.repeat_interleave(rr))
    x = torch.randn(4, 3)
    rr = torch.tensor([1, 0, 2, 3], dtype=dtype)
    assert torch.equal(x.to("tpu").repeat_interleave(rr.to("tpu"), dim=0).cpu(), x.repeat_interleave(rr, dim=0))
    got = x.to("tpu").repeat_interleave(rr.to("tpu"), dim=0, output_size=6)
    assert torch.equal(got.cpu(), x.repeat_interleave(rr, dim=0, output_size=6))


@pytest.mark.parametrize("bad", [[1, -1], [[1]], [1.0]])
def test_repeat_interleave_errors_as_cpu(bad):
    bad = torch.tensor(bad)
    with pytest.raises(Exception) as cpu:
        torch.repeat_interleave(bad)
    with pytest.raises(type(cpu.value), match=str(cpu.value).replace("(", r"\(").replace(")", r"\)")):
        torch.repeat_interleave(bad.to("tpu"))
