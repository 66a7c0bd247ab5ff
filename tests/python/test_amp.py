"""AMP on tpu: the GradScaler kernels (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_)
against CPU's, and torch.amp.GradScaler("tpu") training under float16/bfloat16 autocast as on CUDA."""
import pytest
import torch

import torch_tpu
from conftest import assert_same

INF, NAN = float("inf"), float("nan")


def _grads(dtypes, bad=None):
    torch.manual_seed(0)
    gs = [torch.randn(3, 5).mul(1000).to(dt) for dt in dtypes]
    if bad is not None:
        gs[-1].view(-1)[2] = bad
    return gs


def _unscale(grads, found, inv, dev):
    g = [t.clone().to(dev) for t in grads]
    f, s = found.clone().to(dev), inv.clone().to(dev)
    torch._amp_foreach_non_finite_check_and_unscale_(g, f, s)
    return g, f


@pytest.mark.parametrize("bad", [None, INF, -INF, NAN])
@pytest.mark.parametrize("dtypes", [[torch.float32], [torch.float16, torch.float32],
                                    [torch.bfloat16, torch.float64, torch.float16]])
def test_unscale_matches_cpu(dtypes, bad, no_fallback):
    grads = _grads(dtypes, bad)
    for inv in (torch.tensor(1 / 65536.0), torch.tensor(0.3), torch.tensor(1.0)):
        for found in (torch.tensor(0.0), torch.tensor(1.0)):  # found_inf accumulates: never reset to 0
            want_g, want_f = _unscale(grads, found, inv, "cpu")
            got_g, got_f = _unscale(grads, found, inv, "tpu")
            assert_same(got_f, want_f)
            for a, b in zip(got_g, want_g):
                assert_same(a, b, equal_nan=True, rtol=0, atol=0)


def test_unscale_strided_views_and_empty(no_fallback):
    base = torch.arange(24.0).reshape(4, 6)
    want = base.clone()
    got = base.to("tpu")
    empty_cpu, empty_tpu = torch.empty(0), torch.empty(0, device="tpu")
    f_cpu, f_tpu = torch.zeros(()), torch.zeros((), device="tpu")
    torch._amp_foreach_non_finite_check_and_unscale_([want[:, ::2], want.t()[1], empty_cpu], f_cpu, torch.tensor(0.5))
    torch._amp_foreach_non_finite_check_and_unscale_([got[:, ::2], got.t()[1], empty_tpu], f_tpu,
                                                     torch.tensor(0.5, device="tpu"))
    assert_same(got, want)
    assert_same(f_tpu, f_cpu)
    torch._amp_foreach_non_finite_check_and_unscale_([], torch.zeros(3, device="tpu"), f_tpu)  # no checks, as CPU


def _err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e), str(e).replace("CPU tensor", "tpu tensor")
    return None


_UNSCALE_BAD = {
    "found_numel": lambda d: ([torch.ones(2, device=d)], torch.zeros(2, device=d), torch.ones((), device=d)),
    "inv_numel": lambda d: ([torch.ones(2, device=d)], torch.zeros((), device=d), torch.ones(2, device=d)),
    "found_dtype": lambda d: ([torch.ones(2, device=d)], torch.zeros((), device=d, dtype=torch.float64),
                              torch.ones((), device=d)),
    "inv_dtype": lambda d: ([torch.ones(2, device=d)], torch.zeros((), device=d), torch.ones((), device=d).half()),
    "long_grad": lambda d: ([torch.ones(2, device=d, dtype=torch.long)], torch.zeros((), device=d),
                            torch.ones((), device=d)),
    "int_after_float": lambda d: ([torch.ones(2, device=d), torch.ones(2, device=d, dtype=torch.int32)],
                                  torch.zeros((), device=d), torch.ones((), device=d)),
    "complex_grad": lambda d: ([torch.ones(2, device=d, dtype=torch.complex64)], torch.zeros((), device=d),
                               torch.ones((), device=d)),
}


@pytest.mark.parametrize("case", sorted(_UNSCALE_BAD))
def test_unscale_errors_as_cpu(case):
    want = _err(lambda: torch._amp_foreach_non_finite_check_and_unscale_(*_UNSCALE_BAD[case]("cpu")))
    got = _err(lambda: torch._amp_foreach_non_finite_check_and_unscale_(*_UNSCALE_BAD[case]("tpu")))
    assert want is not None and got == want


def test_unscale_wrong_device_errors():
    g, f, s = [torch.ones(2, device="tpu")], torch.zeros((), device="tpu"), torch.ones((), device="tpu")
    with pytest.raises(RuntimeError, match="inv_scale must be a tpu tensor."):
        torch._amp_foreach_non_finite_check_and_unscale_(g, f, s.cpu())
    with pytest.raises(RuntimeError, match="found_inf must be a tpu tensor."):
        torch._amp_foreach_non_finite_check_and_unscale_(g, f.cpu(), s)
    with pytest.raises(RuntimeError, match="one of scaled_grads was not a tpu tensor."):
        torch._amp_foreach_non_finite_check_and_unscale_([g[0], torch.ones(2)], f, s)


@pytest.mark.parametrize("growth,backoff,interval", [(2.0, 0.5, 3), (1.7, 0.3, 1), (3.0, 0.9, 2)])
def test_update_scale_matches_cpu(growth, backoff, interval, no_fallback):
    found_seq = [0.0, 0.0, 0.0, 1.0, 0.0, NAN, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    state = {d: (torch.tensor(1000.0, device=d), torch.tensor(0, dtype=torch.int32, device=d)) for d in ("cpu", "tpu")}
    for f in found_seq:
        for d, (scale, tracker) in state.items():
            r = torch._amp_update_scale_(scale, tracker, torch.tensor(f, device=d), growth, backoff, interval)
            assert r is scale
        assert_same(state["tpu"][0], state["cpu"][0], rtol=0, atol=0)
        assert_same(state["tpu"][1], state["cpu"][1])


@pytest.mark.parametrize("scale,tracker,interval", [(3e38, 0, 1), (1e38, 4, 5), (5.0, 7, 3), (5.0, -1, 0)])
def test_update_scale_edges(scale, tracker, interval, no_fallback):
    """no growth past float32's range to inf; a tracker past the interval keeps counting (CPU compares ==)"""
    out = {}
    for d in ("cpu", "tpu"):
        s, t = torch.tensor(scale, device=d), torch.tensor(tracker, dtype=torch.int32, device=d)
        torch._amp_update_scale_(s, t, torch.tensor(0.0, device=d), 4.0, 0.5, interval)
        out[d] = (s, t)
    assert_same(out["tpu"][0], out["cpu"][0], rtol=0, atol=0)
    assert_same(out["tpu"][1], out["cpu"][1])


_UPDATE_BAD = {
    "tracker_dtype": lambda d: (torch.tensor(4.0, device=d), torch.tensor(0, device=d), torch.tensor(0.0, device=d)),
    "scale_dtype": lambda d: (torch.tensor(4.0, device=d, dtype=torch.float64),
                              torch.tensor(0, dtype=torch.int32, device=d), torch.tensor(0.0, device=d)),
    "found_dtype": lambda d: (torch.tensor(4.0, device=d), torch.tensor(0, dtype=torch.int32, device=d),
                              torch.tensor(0.0, device=d).half()),
    "scale_numel": lambda d: (torch.ones(2, device=d), torch.tensor(0, dtype=torch.int32, device=d),
                              torch.tensor(0.0, device=d)),
    "tracker_numel": lambda d: (torch.tensor(4.0, device=d), torch.zeros(2, dtype=torch.int32, device=d),
                                torch.tensor(0.0, device=d)),
    "found_numel": lambda d: (torch.tensor(4.0, device=d), torch.tensor(0, dtype=torch.int32, device=d),
                              torch.zeros(2, device=d)),
}


@pytest.mark.parametrize("case", sorted(_UPDATE_BAD))
def test_update_scale_errors_as_cpu(case):
    want = _err(lambda: torch._amp_update_scale_(*_UPDATE_BAD[case]("cpu"), 2.0, 0.5, 3))
    got = _err(lambda: torch._amp_update_scale_(*_UPDATE_BAD[case]("tpu"), 2.0, 0.5, 3))
    assert want is not None and got == want


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _train(dev, dtype, optim, steps=5, init_scale=2.0 ** 20):
    """GradScaler training as a CUDA user writes it; init_scale overflows float16 on the first steps."""
    m = _model().to(dev)
    opt = optim(m.parameters())
    scaler = torch.amp.GradScaler(dev, init_scale=init_scale, growth_interval=2)
    torch.manual_seed(1)
    x, y = torch.randn(32, 6).to(dev), torch.randn(32, 3).to(dev)
    hist = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast(dev, dtype=dtype):
            out = m(x)
            assert out.dtype == dtype
            loss = torch.nn.functional.mse_loss(out.float(), y)
        before = [p.detach().clone() for p in m.parameters()]
        scaler.scale(loss).backward()
        scaler.step(opt)
        scale_used = scaler.get_scale()
        scaler.update()
        changed = any(not torch.equal(a.cpu(), p.detach().cpu()) for a, p in zip(before, m.parameters()))
        hist.append((loss.item(), scale_used, scaler.get_scale(), changed))
    return hist, [p.detach().cpu() for p in m.parameters()]


_OPTIMS = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
           "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True)}


@pytest.mark.parametrize("optim", sorted(_OPTIMS))
def test_gradscaler_fp16_training_matches_cpu(optim, no_fallback, highest):
    want_hist, want_params = _train("cpu", torch.float16, _OPTIMS[optim])
    got_hist, got_params = _train("tpu", torch.float16, _OPTIMS[optim])
    # the same steps are skipped (inf/nan gradients at the large initial scale), the scale moves alike
    assert [h[1:] for h in got_hist] == [h[1:] for h in want_hist]
    skipped = [not h[3] for h in got_hist]
    assert skipped[0] and not all(skipped)  # first step overflows float16: skipped, scale halves
    assert got_hist[0][2] == got_hist[0][1] / 2
    for (a, *_), (b, *_) in zip(got_hist, want_hist):
        assert abs(a - b) <= 2e-3 * abs(b) + 1e-5
    for a, b in zip(got_params, want_params):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-4)


def test_gradscaler_bf16_fused_defer_and_fuse(no_fallback):
    """bfloat16 autocast + GradScaler + fused AdamW in DeferAndFuse: runs on tpu, scale grows every 2 steps"""
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        hist, _ = _train("tpu", torch.bfloat16, _OPTIMS["adamw_fused"], steps=4, init_scale=8.0)
    assert [h[2] for h in hist] == [8.0, 16.0, 16.0, 32.0]
    assert all(h[3] for h in hist)
    assert hist[-1][0] < hist[0][0]
