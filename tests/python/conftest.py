import os

# Tests count compiles: no persistent cache unless a test asks for one.
os.environ.setdefault("TORCH_TPU_CACHE_DIR", "")

import pytest
import torch

import torch_tpu  # noqa: F401  (also autoloaded by `import torch`)


@pytest.fixture
def tpu():
    return torch.device("tpu")


@pytest.fixture
def no_fallback():
    """Fails the test if any op ran on the CPU fallback (its warning is an error)."""
    import warnings

    torch_tpu.metrics.reset()
    with warnings.catch_warnings():
        # the fallback's warning only: other warnings (e.g. the frequent-compile one, whose
        # count spans every test a worker ran before) are not what this fixture checks
        warnings.filterwarnings("error", message=r"(?s).*has no tpu lowering")
        yield
    assert torch_tpu.metrics.cpu_fallbacks() == {}


@pytest.fixture
def highest():
    """Run matmul-like ops at HIGHEST precision (float32-class) for parity checks."""
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        yield


def assert_same(actual, expected, **kw):
    """actual (tpu) matches expected (cpu) in values, dtype and shape."""
    assert actual.device.type == "tpu"
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.cpu(), expected, **kw)
