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
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for n in range(1, 25):  # a new shape each time: a new program each time
            torch.ones(n, device="tpu").neg()
    msgs = [str(x.message) for x in w if "different programs" in str(x.message)]
    assert any("aten::neg" in m for m in msgs)
    assert sum("aten::neg" in m for m in msgs) == 1
    assert torch_tpu.metrics.report()["frequent_compiles"] >= 1
