"""Host reads (.cpu(), .item(), .tolist(), printing) of whole tensors and of views.

On the CPU plugin a buffer already lies in host memory: a read copies from it
directly (its view's elements, without running a gather program first). These tests
check the values against PyTorch on CPU for views of every kind and for buffers whose
program may still be running when the read starts."""
import pytest
import torch

import torch_tpu


def _views(t):
    return {
        "row": t[1],
        "column": t[:, 2],
        "last": t[..., 3],
        "transpose": t.transpose(0, 2),
        "steps": t[::2, 1::3],
        "expand": t[:, :1].expand(5, 4, 7),
        "flat_slice": t.flatten()[3:40],
        "diagonal": t[0].diagonal(),
        "negative_free": t[2:4, 1:5, 2:6].permute(2, 0, 1),
        "scalar": t[1, 2, 3],
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64])
def test_views_read_back_equal_cpu(dtype):
    base = torch.randn(5, 6, 7, dtype=torch.complex64 if dtype.is_complex else torch.float32)
    ref = (base * 3).to(dtype) if dtype is not torch.bool else base.real > 0
    x = (base.to("tpu") * 3).to(dtype) if dtype is not torch.bool else base.to("tpu").real > 0
    for name, (v, r) in {k: (a, b) for (k, a), b in zip(_views(x).items(), _views(ref).values())}.items():
        got = v.cpu()
        assert got.shape == r.shape, name
        assert torch.equal(got, r.contiguous()), name
    assert x[1, 2, 3].item() == ref[1, 2, 3].item()
    assert x[1, :, 3].tolist() == ref[1, :, 3].tolist()


def test_reading_a_view_runs_no_program_on_a_host_memory_plugin():
    x = torch.arange(60.0, device="tpu").reshape(6, 10) * 2
    x.cpu()  # x's program has run
    torch_tpu.metrics.reset()
    assert x[2].tolist() == [float(2 * v) for v in range(20, 30)]
    assert x[:, 3].cpu().tolist() == [float(2 * (10 * r + 3)) for r in range(6)]
    assert x[4, 5].item() == 90.0
    runs = torch_tpu.metrics.executions
    if torch.tpu.get_device_name().startswith("PJRT cpu"):
        assert runs == 0  # read from the buffer's memory, no gather program
    else:
        assert runs <= 3  # a device plugin materialises each view first


def test_read_waits_for_the_program_that_writes_the_buffer(highest):
    _chain_then_read()


def _chain_then_read():
    a = torch.randn(384, 384)
    b = torch.randn(384, 384)
    ta, tb = a.to("tpu"), b.to("tpu")
    want = a
    got = ta
    for _ in range(4):  # a chain of runs, read at once: the last may still be running
        want = torch.tanh(want @ b)
        got = torch.tanh(got @ tb)
    row = got[7].cpu()  # a view first, while the chain may still run
    whole = got.cpu()
    assert torch.equal(row, whole[7])
    assert got[3, 5].item() == whole[3, 5].item()
    torch.testing.assert_close(whole, want, rtol=1e-3, atol=1e-3)


def test_read_of_a_view_after_an_in_place_update():
    x = torch.zeros(4, 8, device="tpu")
    first = x[1].cpu()
    x[1] += 5
    x.mul_(2)
    assert first.tolist() == [0.0] * 8
    assert x[1].tolist() == [10.0] * 8
    assert x[:, 0].tolist() == [0.0, 10.0, 0.0, 0.0]
    assert str(x[1, :2].cpu()) == str(torch.tensor([10.0, 10.0]))
