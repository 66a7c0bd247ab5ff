"""Views, in-place ops and out= variants behave as on CPU: a write through one
view is seen by every other view of the storage."""
import torch

from conftest import assert_same


def both(fn):
    """Runs fn on a fresh CPU and tpu copy of the same base; compares all returned tensors."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    c = fn(base.clone())
    t = fn(base.clone().to("tpu"))
    for a, e in zip(t, c):
        assert_same(a, e)


def test_write_through_slice_seen_by_base_and_other_views():
    def f(x):
        col = x[:, 2]
        row = x[1]
        col.mul_(10)          # strided (column) in-place write
        row[3:5] = -1         # slice assignment: copy_ into a view
        x.t()[0, 2] = 99      # transposed view write
        return x, col, row, x.t()
    both(f)


def test_transpose_permute_expand_diagonal_reads():
    def f(x):
        y = x.view(2, 2, 6).permute(2, 0, 1)
        d = x[:, :4].diagonal()
        e = x[0:1, :].expand(3, 6)
        s = x[::2, 1::3]
        return y + 0, d * 1, e.sum(0), s.contiguous(), x.unfold(1, 2, 2) + 0
    both(f)


def test_inplace_on_diagonal_and_as_strided():
    def f(x):
        x.diagonal().add_(100)
        v = x.as_strided((3, 2), (6, 2), 1)
        v.fill_(7)
        return x, v
    both(f)


def test_select_squeeze_unsqueeze_flatten_views_alias():
    def f(x):
        a = x.unsqueeze(0).squeeze(0)
        b = x.flatten()
        a[2, 2] = 1000
        b[0] = -5
        return x, a, b, x.select(1, 2)
    both(f)


def test_out_variants_and_resize():
    def f(x):
        out = torch.empty(0, device=x.device)
        torch.add(x, 1, out=out)           # out= resizes an empty out tensor
        mm_out = torch.empty(4, 4, device=x.device)
        torch.mm(x, x.t(), out=mm_out)
        s = torch.empty(6, device=x.device)
        torch.sum(x, 0, out=s)
        return out, mm_out, s
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        both(f)


def test_view_dtype_and_contiguous_semantics():
    x = torch.arange(8, dtype=torch.float32, device="tpu")
    iv = x.view(torch.int32)
    assert torch.equal(iv.cpu(), torch.arange(8, dtype=torch.float32).view(torch.int32))
    y = x.view(2, 4).t()
    assert not y.is_contiguous()
    assert y.contiguous().is_contiguous()
    z = y.reshape(8)  # needs a copy: non-viewable
    assert torch.equal(z.cpu(), torch.arange(8.0).view(2, 4).t().reshape(8))
    assert x.data_ptr() != z.data_ptr()
    assert x.view(2, 4).data_ptr() == x.data_ptr()


def test_autograd_through_views_and_inplace():
    for dev in ("cpu", "tpu"):
        torch.manual_seed(0)
    w_cpu = torch.randn(4, 4, requires_grad=True)
    w_tpu = w_cpu.detach().to("tpu").requires_grad_(True)
    res = []
    for w in (w_cpu, w_tpu):
        y = w * 2
        y[:, 1].mul_(3)           # in-place on a view of a non-leaf
        z = y.t().relu().sum()
        z.backward()
        res.append(w.grad.cpu())
    torch.testing.assert_close(res[1], res[0])


def test_zero_size_and_scalars():
    e = torch.empty(0, 3, device="tpu")
    assert (e + 1).shape == (0, 3)
    assert e.sum().item() == 0
    s = torch.tensor(2.5, device="tpu")
    assert (s * 4).item() == 10.0
    assert torch.zeros(3, device="tpu").tolist() == [0.0, 0.0, 0.0]
    assert torch.full((2,), 7, device="tpu").tolist() == [7, 7]
    assert torch.ones(2, 2, dtype=torch.int64, device="tpu").sum().item() == 4


def test_inplace_op_on_a_slice_updates_the_storage_in_place(tmp_path):
    # c[1].add_(1) loads the row and stores it back at one offset: the program must read
    # one offset parameter for both, so that XLA updates the row inside the donated buffer
    # instead of building it in a temporary and copying it back (a large slice then cost
    # 10-30x the whole tensor's update). The compiler's buffer assignment shows it.
    import os
    import re
    import subprocess
    import sys
    code = (
        "import torch, torch_tpu\n"
        "c = torch.zeros(8, 4096, device='tpu'); torch.tpu.synchronize()\n"
        "c[3].add_(1); c[5:7].add_(2); torch.tpu.synchronize()\n"
        "e = torch.zeros(8, 4096); e[3] += 1; e[5:7] += 2\n"
        "assert torch.equal(c.cpu(), e)\n"
    )
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={tmp_path} --xla_dump_hlo_as_text",
               TORCH_TPU_DEFER_AND_FUSE="0", TORCH_TPU_CACHE_DIR="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    checked = 0
    for f in tmp_path.glob("*after_optimizations-buffer-assignment.txt"):
        text = f.read_text()
        if "dynamic-update-slice" not in text:
            continue
        sizes = [int(s) for s in re.findall(r"^allocation \d+: size (\d+)", text, re.M)]
        # the storage (donated, aliased with the output) and the scalar parameters only
        assert max(sizes) == 8 * 4096 * 4, (f.name, sizes)
        assert [s for s in sizes if 8 < s < 8 * 4096 * 4] == [], (f.name, sizes)
        checked += 1
    assert checked == 2, sorted(p.name for p in tmp_path.iterdir())
