"""Engine reliability (issue 10): no compile storms from loops over views, a
warning when one op keeps compiling new programs."""
import warnings

import pytest
import torch

import torch_tpu


@pytest.fixture
def mode(request):
    with torch_tpu.eager_mode(request.param):
        yield request.param


BOTH = [torch_tpu.EagerMode.DEFER_NEVER, torch_tpu.EagerMode.DEFER_AND_FUSE]


@pytest.mark.parametrize("mode", BOTH, indirect=True)
def test_loop_over_row_views_compiles_once(mode):
    x = torch.randn(64, 32, device="tpu")
    torch_tpu._C.clear_compile_cache()
    torch_tpu.metrics.reset()
    ys = [x[i].abs() for i in range(64)]
    torch.testing.assert_close(torch.stack(ys).cpu(), x.cpu().abs())
    assert torch_tpu.metrics.report()["compiles"] <= 2


@pytest.mark.parametrize("mode", BOTH, indirect=True)
def test_loops_over_columns_windows_and_row_writes(mode):
    x = torch.randn(40, 24, device="tpu")
    xc = x.cpu()
    torch_tpu._C.clear_compile_cache()
    torch_tpu.metrics.reset()
    cols = torch.stack([x[:, j].exp() for j in range(24)], 1)
    wins = torch.stack([x[i:i + 4, 2:10].sum() for i in range(30)])
    z = torch.zeros(40, 24, device="tpu")
    for i in range(40):
        z[i] = i
    torch.testing.assert_close(cols.cpu(), xc.exp())
    torch.testing.assert_close(wins.cpu(), torch.stack([xc[i:i + 4, 2:10].sum() for i in range(30)]), atol=1e-5,
                               rtol=1e-5)
    assert torch.equal(z.cpu(), torch.arange(40.0)[:, None].expand(40, 24))
    # columns: first column and the others (the last padded row of a later column runs past the end)
    assert torch_tpu.metrics.report()["compiles"] <= 10


def test_frequent_compiles_warn_once_and_are_counted():
    torch_tpu._C.clear_compile_cache()
    torch_tpu.metrics.reset()
    x = torch.randn(16, device="tpu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(1, 13):  # new shapes are expected to compile: no warning
            torch.ones(n, device="tpu").neg()
        for k in range(1, 25):  # the shift is part of the program: same shapes, a new program each time
            torch.roll(x, k)
    msgs = [str(x.message) for x in w if "different programs" in str(x.message)]
    assert not any("aten::neg" in m for m in msgs)
    assert sum("aten::roll" in m for m in msgs) == 1
    assert torch_tpu.metrics.report()["frequent_compiles"] >= 1


# ---- device-side checks: out-of-range indices raise CPU's error at the next host sync

def _cases(d):
    x = torch.zeros(5, device=d)
    i = torch.tensor([1, 10], device=d)
    o = torch.ones(2, device=d)
    F = torch.nn.functional
    return {
        "index": lambda: x[i],
        "index_put": lambda: x.clone().index_put_((i,), torch.tensor(1.0, device=d)),
        "index_select": lambda: x.index_select(0, i),
        "gather": lambda: x.gather(0, i),
        "scatter": lambda: x.clone().scatter_(0, i, 1.0),
        "scatter_add": lambda: x.clone().scatter_add_(0, i, o),
        "scatter_reduce": lambda: x.clone().scatter_reduce_(0, i, o, "sum"),
        "take": lambda: x.take(i),
        "put": lambda: x.clone().put_(i, o),
        "embedding": lambda: F.embedding(i, torch.zeros(5, 3, device=d)),
        "nll_loss": lambda: F.nll_loss(torch.zeros(2, 5, device=d), i),
        "cross_entropy": lambda: F.cross_entropy(torch.zeros(2, 5, device=d), i),
        "index_add": lambda: x.clone().index_add_(0, i, o),
        "index_copy": lambda: x.clone().index_copy_(0, i, o),
        "index_fill": lambda: x.clone().index_fill_(0, i, 1.0),
        "index_reduce": lambda: x.clone().index_reduce_(0, i, o, "prod"),
        "masked_scatter": lambda: x.clone().masked_scatter_(torch.ones(5, dtype=torch.bool, device=d), o),
    }


def _error(f):
    try:
        r = f()
        if isinstance(r, torch.Tensor):
            r.cpu()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e).splitlines()[0]
    return None


@pytest.mark.parametrize("name", list(_cases("cpu")))
def test_out_of_range_raises_cpu_error(name):
    import warnings as w

    with w.catch_warnings():
        w.simplefilter("ignore")  # index_reduce is beta
        expected = _error(_cases("cpu")[name])
        got = _error(_cases("tpu")[name])
    assert expected is not None
    assert got == expected
    assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0  # the device stays usable


def test_check_names_the_python_line_and_waits_for_the_sync():
    x = torch.zeros(5, device="tpu")
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        y = x[torch.tensor([1, 10], device="tpu")] * 2  # THE LINE
        z = y + 1  # no error yet: the program has not run
        with pytest.raises(IndexError, match="index 10 is out of bounds") as e:
            z.cpu()
    assert "aten::index.Tensor" in str(e.value) and "test_engine_reliability.py" in str(e.value)


def test_debug_mode_raises_at_the_op():
    x = torch.zeros(5, device="tpu")
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        with pytest.raises(IndexError):
            x.index_select(0, torch.tensor([7], device="tpu"))


def test_check_inside_compiled_graph():
    f = torch.compile(lambda t, i: torch.nn.functional.embedding(i, t) * 2)
    t = torch.ones(5, 3, device="tpu")
    with pytest.raises(IndexError, match="index out of range in self"):
        f(t, torch.tensor([0, 7], device="tpu")).cpu()
    assert f(t, torch.tensor([0, 4], device="tpu")).sum().item() == 12.0


def test_checks_can_be_turned_off():
    import subprocess
    import sys

    code = ("import torch\nx = torch.zeros(5, device='tpu')\n"
            "print(x[torch.tensor([1, 10], device='tpu')].cpu().tolist())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(__import__("os").environ, TORCH_TPU_DEVICE_CHECKS="0"))
    assert r.returncode == 0, r.stderr
    assert len(eval(r.stdout.strip())) == 2
