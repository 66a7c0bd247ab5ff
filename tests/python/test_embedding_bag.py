"""nn.EmbeddingBag / F.embedding_bag on tpu (torch_tpu/_embedding_bag.py): forward and backward
against PyTorch on CPU, natively (no CPU fallback), in Strict, DeferAndFuse and compiled mode."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import metrics

CASES = [
    dict(mode="sum"), dict(mode="mean"), dict(mode="max"),
    dict(mode="sum", psw=True), dict(mode="mean", pad=4), dict(mode="max", pad=2), dict(mode="sum", pad=0),
    dict(mode="sum", last=True), dict(mode="mean", last=True), dict(mode="max", last=True),
    dict(mode="sum", two_d=True), dict(mode="mean", two_d=True), dict(mode="max", two_d=True),
    dict(mode="sum", int32=True), dict(mode="sum", dtype=torch.bfloat16), dict(mode="mean", dtype=torch.float16),
]


def run(device, mode, psw=False, pad=None, last=False, two_d=False, int32=False, dtype=torch.float32):
    torch.manual_seed(0)
    weight = torch.randn(10, 4, dtype=dtype).to(device).requires_grad_()
    if two_d:
        idx, off = torch.randint(0, 10, (3, 4)), None
    else:  # bags of 4, 0 (empty), 3 and 3 indices
        idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 0])
        off = torch.tensor([0, 4, 4, 7] + ([10] if last else []))
    if int32:
        idx, off = idx.int(), off.int()
    idx = idx.to(device)
    off = off.to(device) if off is not None else None
    p = torch.randn(idx.numel(), dtype=dtype).to(device).requires_grad_() if psw else None
    out = F.embedding_bag(idx, weight, off, mode=mode, per_sample_weights=p, padding_idx=pad,
                          include_last_offset=last)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    (out * grad).sum().backward()
    return [t.cpu() for t in (out.detach(), weight.grad, p.grad if psw else torch.zeros(()))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_embedding_bag_forward_and_backward_match_cpu_without_fallback(case):
    metrics.reset()
    got = run("tpu", **case)
    assert metrics.cpu_fallbacks() == {}, metrics.cpu_fallbacks()
    want = run("cpu", **case)
    tol = dict(rtol=2e-2, atol=2e-2) if "dtype" in case else dict(rtol=1e-5, atol=1e-5)
    for g, w, name in zip(got, want, ("output", "weight.grad", "per_sample_weights.grad")):
        torch.testing.assert_close(g, w, **tol, msg=name)


def test_embedding_bag_scale_grad_by_freq_divides_by_the_index_count():
    """As CUDA computes it: each row's gradient divided by how often its index occurs in the batch
    (CPU's kernel scales some rows by another index's count; CUDA semantics are the reference)."""
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 0])
    off = torch.tensor([0, 4, 7])
    weight = torch.randn(10, 3, device="tpu", requires_grad=True)
    F.embedding_bag(idx.to("tpu"), weight, off.to("tpu"), mode="sum", scale_grad_by_freq=True).sum().backward()
    counts = torch.bincount(idx, minlength=10).clamp(min=1).float()
    want = torch.bincount(idx, minlength=10).float() / counts  # each occurrence gives 1, scaled by 1/count
    torch.testing.assert_close(weight.grad.cpu(), want.unsqueeze(1).expand(10, 3))


def test_embedding_bag_module_in_every_mode_of_execution():
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(50, 8, mode="mean")
    idx = torch.randint(0, 50, (20,))
    off = torch.tensor([0, 5, 9, 9, 15])
    want = bag(idx, off)
    tpu_bag = bag.to("tpu")
    args = (idx.to("tpu"), off.to("tpu"))
    torch.testing.assert_close(tpu_bag(*args).cpu(), want, rtol=1e-5, atol=1e-6)
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        torch.testing.assert_close(tpu_bag(*args).cpu(), want, rtol=1e-5, atol=1e-6)
    compiled = torch.compile(tpu_bag, backend="tpu")
    out = compiled(*args)
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert tpu_bag.weight.grad is not None and tpu_bag.weight.grad.device.type == "tpu"


def test_embedding_bag_errors_as_on_cpu():
    w = torch.randn(10, 4, device="tpu")
    idx = torch.tensor([1, 2, 3], device="tpu")
    off = torch.tensor([0, 2], device="tpu")
    with pytest.raises(RuntimeError, match="expected indices to be long or int"):
        F.embedding_bag(idx.float(), w, off)
    with pytest.raises((RuntimeError, NotImplementedError), match="per_sample_weights"):
        F.embedding_bag(idx, w, off, mode="max", per_sample_weights=torch.ones(3, device="tpu"))
    with pytest.raises(NotImplementedError, match="sparse=True"):
        F.embedding_bag(idx, w.requires_grad_(), off, sparse=True)
