"""torch._grouped_mm (F.grouped_mm) on tpu: every shape form, float32/bfloat16, forward and
backward against a per-group loop on CPU, inside torch.compile without a graph break, and
CPU's errors for bad input. HuggingFace's MoE layers call it for tpu weights of any dtype."""
import pytest
import torch

import torch_tpu


@pytest.fixture(autouse=True)
def highest():
    prev = torch.tpu.get_matmul_precision()
    torch.tpu.set_matmul_precision(torch.tpu.Precision.HIGHEST)
    yield
    torch.tpu.set_matmul_precision(prev)


def _reference(a, b, offs):
    """The op's meaning, one group at a time (rows past the last offset: zero)."""
    if offs is None:
        return torch.bmm(a, b)
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    if a.dim() == 2 and b.dim() == 3:
        out = a.new_zeros(a.size(0), b.size(-1))
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = a[s:e] @ b[g]
        return out
    if a.dim() == 3 and b.dim() == 2:
        out = a.new_zeros(a.size(1), b.size(-1))
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[:, s:e] = a[g] @ b[:, s:e]
        return out
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])


CASES = {
    "2d_3d": ((9, 8), (3, 8, 16), [2, 5, 7]),  # MoE experts: rows in groups (row 8 in no group)
    "2d_3d_empty_group": ((8, 8), (3, 8, 16), [3, 3, 8]),
    "3d_2d": ((3, 4, 8), (8, 12), [4, 8, 12]),
    "2d_2d": ((4, 12), (12, 8), [4, 4, 12]),
    "3d_3d": ((3, 4, 8), (3, 8, 4), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_matches_per_group_loop(no_fallback, case, dtype):
    sa, sb, offs = CASES[case]
    g = torch.Generator().manual_seed(0)
    a = torch.randn(sa, generator=g).to(dtype).requires_grad_()
    b = torch.randn(sb, generator=g).to(dtype).requires_grad_()
    o = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    ref = _reference(a.float(), b.float(), o)
    w = torch.randn(ref.shape, generator=g)
    (ref * w).sum().backward()
    at = a.detach().to("tpu").requires_grad_()
    bt = b.detach().to("tpu").requires_grad_()
    out = torch._grouped_mm(at, bt, offs=None if o is None else o.to("tpu"))
    assert out.dtype == dtype and out.shape == ref.shape
    (out.float() * w.to("tpu")).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float().cpu(), ref.detach(), atol=tol * 10, rtol=tol)
    torch.testing.assert_close(at.grad.float().cpu(), a.grad.float(), atol=tol * 10, rtol=tol)
    torch.testing.assert_close(bt.grad.float().cpu(), b.grad.float(), atol=tol * 10, rtol=tol)


def test_grouped_mm_compiles_into_one_graph(no_fallback):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(10, 8, generator=g), torch.randn(4, 8, 6, generator=g)
    offs = torch.tensor([1, 4, 4, 10], dtype=torch.int32)
    f = torch.compile(lambda x, y, o: torch.nn.functional.grouped_mm(x, y, offs=o).relu(), fullgraph=True)
    out = f(a.to("tpu"), b.to("tpu"), offs.to("tpu"))
    torch.testing.assert_close(out.cpu(), _reference(a, b, offs).relu(), atol=1e-5, rtol=1e-5)
    assert torch_tpu._compile.stats()["eager_nodes"] == 0


@pytest.mark.parametrize("bad", [
    lambda a, b, o: torch._grouped_mm(a, b),                         # offsets missing
    lambda a, b, o: torch._grouped_mm(a, b.double(), offs=o),        # dtype
    lambda a, b, o: torch._grouped_mm(a.int(), b.int(), offs=o),     # integer inputs
    lambda a, b, o: torch._grouped_mm(a, b, offs=o.long()),          # offsets dtype
    lambda a, b, o: torch._grouped_mm(a, b[:2], offs=o),             # group count
    lambda a, b, o: torch._grouped_mm(a[:, :4], b, offs=o),          # contraction size
    lambda a, b, o: torch._grouped_mm(a, b, offs=o, bias=torch.zeros(8, device=a.device)),
])
def test_grouped_mm_errors_match_cpu(bad):
    a, b = torch.randn(8, 8), torch.randn(3, 8, 8)
    o = torch.tensor([2, 5, 7], dtype=torch.int32)
    with pytest.raises(RuntimeError) as cpu:
        bad(a, b, o)
    with pytest.raises(RuntimeError) as tpu:
        bad(a.to("tpu"), b.to("tpu"), o.to("tpu"))
    assert str(tpu.value) == str(cpu.value)
