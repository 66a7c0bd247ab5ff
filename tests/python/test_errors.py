"""Bad input raises PyTorch's own exception type (and message) and the process
carries on; nothing a user can reach aborts."""
import os
import subprocess
import sys

import pytest
import torch


def same_error(fn, *cpu_args):
    """fn raises the same exception type and message on CPU and tpu."""
    with pytest.raises(Exception) as ce:
        fn(*cpu_args)
    with pytest.raises(Exception) as te:
        fn(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args])
    assert type(te.value) is type(ce.value), (te.value, ce.value)
    return str(ce.value), str(te.value)


def test_shape_mismatch():
    c, t = same_error(lambda a, b: a + b, torch.ones(3), torch.ones(4))
    assert c == t
    c, t = same_error(lambda a, b: a @ b, torch.ones(2, 3), torch.ones(4, 5))
    assert c == t


def test_dtype_errors():
    c, t = same_error(lambda a: a.add_(0.5), torch.ones(3, dtype=torch.int64))
    assert c == t
    c, t = same_error(lambda a, b: torch.mm(a, b), torch.ones(2, 2), torch.ones(2, 2, dtype=torch.float64))
    assert type(c) is type(t)


def test_index_out_of_range_python_indexing():
    c, t = same_error(lambda a: a[10], torch.ones(5))
    assert c == t


def test_cpu_tpu_mix_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device="tpu") + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(torch.ones(2, 2, device="tpu"), torch.ones(2, 2))
    # 0-dim CPU tensors are allowed, as on CUDA
    assert (torch.ones(3, device="tpu") * torch.tensor(2.0)).tolist() == [2.0, 2.0, 2.0]


def test_process_survives_errors():
    for _ in range(3):
        with pytest.raises(RuntimeError):
            torch.ones(2, 3, device="tpu").view(4)
    assert (torch.ones(2, device="tpu") + 1).tolist() == [2.0, 2.0]


def test_fallback_disabled_raises_not_implemented():
    code = (
        "import torch\n"
        "x = torch.tensor([[3.0, 1.0], [2.0, 4.0]], device='tpu')\n"
        "try:\n"
        "    torch.linalg.svdvals(x)\n"
        "except NotImplementedError as e:\n"
        "    assert 'aten::_linalg_svd' in str(e), str(e)\n"
        "    print('raised')\n"
    )
    env = dict(os.environ, TORCH_TPU_CPU_FALLBACK="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "raised", out.stderr[-2000:]


def test_fallback_warns_once_and_is_counted():
    import torch_tpu

    torch_tpu.metrics.reset()
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]], device="tpu")
    with pytest.warns(UserWarning, match="aten::_linalg_svd"):
        a = torch.linalg.svdvals(x)
    b = torch.linalg.svdvals(x)
    assert a.device.type == "tpu" and torch.allclose(a.cpu(), torch.tensor([2.0, 1.0])) and torch.equal(a.cpu(), b.cpu())
    assert torch_tpu.metrics.cpu_fallbacks()["aten::_linalg_svd.U"] == 2


def test_debug_mode_reports_errors_at_the_op():
    import torch_tpu

    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        assert torch_tpu.get_eager_mode() == torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        y = torch.ones(4, device="tpu") * 3
        assert y.sum().item() == 12
        with pytest.raises(RuntimeError):
            torch.ones(2, device="tpu") + torch.ones(3, device="tpu")
    assert torch_tpu.get_eager_mode() == torch_tpu.EagerMode.DEFER_NEVER


def test_data_dependent_shapes_run_correctly():
    x = torch.tensor([[1.0, -2.0], [3.0, -4.0]])
    t = x.to("tpu")
    assert torch.equal(t[t > 0].cpu(), x[x > 0])
    assert torch.equal(torch.masked_select(t, t < 0).cpu(), torch.masked_select(x, x < 0))
    assert torch.unique(torch.tensor([3, 1, 3], device="tpu")).tolist() == [1, 3]


def test_autocast_bfloat16():
    lin = torch.nn.Linear(8, 4).to("tpu")
    x = torch.randn(2, 8, device="tpu")
    with torch.autocast("tpu"):  # bfloat16 is the default autocast dtype for tpu
        y = lin(x)
        s = torch.softmax(y, -1)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    ref = torch.nn.functional.linear(x.cpu().bfloat16(), lin.weight.cpu().bfloat16(), lin.bias.cpu().bfloat16())
    torch.testing.assert_close(y.cpu(), ref, rtol=2e-2, atol=2e-2)


def test_randint_on_device():
    torch.tpu.manual_seed(3)
    r = torch.randint(2, 9, (1000,), device="tpu").cpu()
    assert r.min().item() >= 2 and r.max().item() <= 8 and len(set(r.tolist())) == 7
