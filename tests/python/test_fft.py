"""torch.fft on tpu (stablehlo.fft, one signal dim at a time) against CPU, with
gradients, and complex views (view_as_real / view_as_complex) sharing storage."""

import pytest
import torch



@pytest.fixture(autouse=True)
def _no_fallback(no_fallback):
    yield


REAL_IN = [torch.fft.fft, torch.fft.rfft, torch.fft.fft2, torch.fft.rfftn, torch.fft.ihfft, torch.fft.ihfft2]
COMPLEX_IN = [torch.fft.ifft, torch.fft.irfft, torch.fft.hfft, torch.fft.ifftn, torch.fft.irfft2]


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
@pytest.mark.parametrize("f", REAL_IN + COMPLEX_IN, ids=lambda f: f.__name__)
def test_fft_matches_cpu_with_gradients(f, norm):
    g = torch.Generator().manual_seed(0)
    dtype = torch.complex64 if f in COMPLEX_IN else torch.float32
    x = torch.randn(4, 6, 5, generator=g, dtype=dtype, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    a, b = f(x, norm=norm), f(xt, norm=norm)
    torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-4, atol=1e-4)
    w = torch.randn(a.shape, generator=g, dtype=a.dtype)
    (a * w).abs().sum().backward()
    (b * w.to("tpu")).abs().sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=1e-3, atol=1e-3)


def test_complex_views_share_storage():
    x = torch.randn(3, 4, dtype=torch.complex64)
    t = x.to("tpu")
    r = torch.view_as_real(t)
    assert torch.equal(r.cpu(), torch.view_as_real(x))
    r[1, 2, 1] = 7.0  # writes the imaginary part of t[1, 2]
    assert t[1, 2].cpu().imag.item() == 7.0
    back = torch.view_as_complex(r)
    assert torch.equal(back.cpu(), t.cpu())
    assert torch.equal(torch.conj_physical(t).cpu(), torch.conj_physical(t.cpu()))
