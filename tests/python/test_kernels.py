"""Custom kernels (torch_tpu.kernels): StableHLO and JAX/Pallas kernels as PyTorch
ops on tpu. The three examples of examples/custom_kernels.py (StableHLO RMSNorm,
JAX softmax cross-entropy with a JAX-derived backward, Pallas tiled matmul) match
PyTorch forward and backward in Strict mode, fused into one DeferAndFuse program
and inside torch.compile (no graph break, one program per graph); the trace cache
replays and leaves graphs with kernels; mutation and donation; bad kernels raise
KernelError and the process carries on; StableHLO kernels and cached JAX kernels
run with JAX blocked."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import torch_tpu
from torch_tpu import kernels
from torch_tpu.kernels import KernelError, TensorSpec

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))
import custom_kernels as ex  # noqa: E402  (registers the examples::* ops)

E = torch_tpu.EagerMode


@pytest.fixture(autouse=True)
def highest_precision():
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        yield


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def rms(x, w):
    return ex.rmsnorm(x, w, 1e-6)


def rms_ref(x, w):
    return ex.rmsnorm_reference(x, w, 1e-6)


def inputs(name):
    g = torch.Generator().manual_seed(1)
    if name == "rmsnorm":
        return rms, rms_ref, (torch.randn(6, 32, generator=g), torch.randn(32, generator=g))
    if name == "xent":
        return ex.softmax_xent, torch.nn.functional.cross_entropy, (
            torch.randn(12, 10, generator=g), torch.randint(0, 10, (12,), generator=g))
    return ex.pallas_matmul, torch.matmul, (torch.randn(16, 32, generator=g), torch.randn(32, 48, generator=g))


# (b) and (c) are JAX kernels: exporting them needs the optional extra torch_tpu[jax],
# which CI installs (requirements.txt); without it only the StableHLO kernel can run
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                               reason="JAX (the optional extra torch_tpu[jax]) is not installed")
EXAMPLES = ["rmsnorm", pytest.param("xent", marks=needs_jax), pytest.param("pallas_matmul", marks=needs_jax)]


def value_and_grads(f, args, device):
    leaves = [a.detach().clone().to(device).requires_grad_(a.dtype.is_floating_point) for a in args]
    out = f(*leaves)
    (out * torch.linspace(0.5, 1.5, out.numel(), device=device).reshape(out.shape)).sum().backward()
    return [out.detach().cpu()] + [a.grad.cpu() for a in leaves if a.requires_grad]


def assert_all_close(got, want, tol=2e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def settle():
    torch.tpu.synchronize()
    torch_tpu.metrics.reset()


# ---------------------------------------------------------------- parity
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_forward_backward_matches_pytorch(name):
    kernel, ref, args = inputs(name)
    assert_all_close(value_and_grads(kernel, args, "tpu"), value_and_grads(ref, args, "cpu"))


def test_rmsnorm_bfloat16_and_leading_dims():
    x, w = torch.randn(2, 3, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    y = rms(x.tpu(), w.tpu())
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    torch.testing.assert_close(y.cpu(), rms_ref(x, w), rtol=1e-2, atol=1e-2)


def test_strided_inputs_are_loaded_like_any_op():
    x = torch.randn(32, 6)
    w = torch.randn(32)
    xt = x.tpu().t()  # a transposed view
    torch.testing.assert_close(rms(xt, w.tpu()).cpu(), rms_ref(x.t(), w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_fuses_into_one_deferred_program(name):
    kernel, ref, args = inputs(name)
    on_tpu = [a.tpu() for a in args]
    f = lambda *t: (kernel(*t) * 2 + 1).sum()  # noqa: E731
    want = (ref(*args) * 2 + 1).sum()
    with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        f(*on_tpu).item()  # first run: records the trace
        settle()
        for _ in range(2):
            got = f(*on_tpu).item()
        m = torch_tpu.metrics.report()
    assert abs(got - want.item()) <= 1e-4 * max(1.0, abs(want.item()))
    assert m["executions"] == 2 and m["flushes"] == 2, m  # one program per step: nothing split it
    assert m["trace_hits"] == 2 and m["compiles"] == 0, m


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_inside_torch_compile_one_program_per_step(name, fresh_dynamo):
    kernel, ref, args = inputs(name)
    f = lambda *t: (kernel(*t) * 2 + 1)  # noqa: E731
    cf = torch.compile(f, fullgraph=True)  # fullgraph: a graph break would raise
    with torch.no_grad():
        on_tpu = [a.tpu() for a in args]
        torch.testing.assert_close(cf(*on_tpu).cpu(), ref(*args) * 2 + 1, rtol=2e-5, atol=2e-5)
        settle()
        for _ in range(3):
            cf(*on_tpu)
        torch.tpu.synchronize()
        m = torch_tpu.metrics.report()
    assert m["executions"] == 3 and m["compiled_runs"] == 3 and m["captures"] == 0, m
    assert m["compiled_eager_nodes"] == 0, m


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_training_step_under_torch_compile(name, fresh_dynamo):
    kernel, ref, args = inputs(name)
    f = lambda *t: (kernel(*t) * 2 + 1)  # noqa: E731
    cf = torch.compile(f, fullgraph=True)
    want = value_and_grads(lambda *t: ref(*t) * 2 + 1, args, "cpu")
    assert_all_close(value_and_grads(cf, args, "tpu"), want)
    settle()
    for _ in range(2):
        value_and_grads(cf, args, "tpu")
    m = torch_tpu.metrics.report()
    # per step two compiled programs: the forward and the backward (the kernel's backward
    # inside it); no eager node, no new capture
    assert m["compiled_runs"] == 4 and m["compiled_eager_nodes"] == 0 and m["captures"] == 0, m


# ---------------------------------------------------------------- the trace cache
def test_trace_cache_replays_and_leaves_graphs_with_kernels():
    torch_tpu._C._set_tracing(True, True)  # verify: replayed text must equal the built text
    try:
        x, w = torch.randn(4, 32), torch.randn(32)
        xt, wt = x.tpu(), w.tpu()
        with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
            for _ in range(2):
                a = (rms(xt * 2, wt) * 3).cpu()
            settle()
            # same first ops, then different ones: the graph leaves the recorded trace
            # after the kernel and needs the kernel's function in its own text
            b = (rms(xt * 2, wt) + 5).cpu()
            m = torch_tpu.metrics.report()
        torch.testing.assert_close(a, rms_ref(x * 2, w) * 3, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b, rms_ref(x * 2, w) + 5, rtol=1e-5, atol=1e-5)
        assert m["trace_exits"] >= 1 and m["trace_verify_failures"] == 0, m
    finally:
        torch_tpu._C._set_tracing(True, False)


@needs_jax
def test_two_kernels_and_repeated_calls_share_one_program():
    x, w = torch.randn(16, 32), torch.randn(32)
    xt, wt, ones = x.tpu(), w.tpu(), torch.ones(16, 16).tpu()  # uploads flush pending work: before
    with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        settle()
        y = rms(rms(xt, wt), wt)
        z = ex.pallas_matmul(y[:, :16].contiguous(), ones)
        got = z.cpu()
        m = torch_tpu.metrics.report()
    text = torch_tpu._C.last_program()
    assert m["executions"] == 1, m
    assert text.count("func.func private @k_examples__rmsnorm_") == 1 and text.count("@k_examples__rmsnorm_") == 3
    assert "@k_examples__pallas_matmul_" in text
    want = rms_ref(rms_ref(x, w), w)[:, :16] @ torch.ones(16, 16)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- specialisation and caches
def test_static_arguments_and_shapes_specialise_once():
    x, w = torch.randn(4, 32).tpu(), torch.randn(32).tpu()
    n = len(ex.rmsnorm._specs)
    ex.rmsnorm(x, w, 1e-6)
    ex.rmsnorm(x, w, 1e-6)
    ex.rmsnorm(x, w, 1e-3)
    ex.rmsnorm(x[:2], w, 1e-3)
    assert len(ex.rmsnorm._specs) <= n + 3
    keys = {k for k in ex.rmsnorm._specs if k[1] in ((1e-6,), (1e-3,)) and k[0][0][0] in (torch.Size([4, 32]),
                                                                                         torch.Size([2, 32]))}
    assert len(keys) == 3


@needs_jax
def test_jax_kernel_is_exported_once_per_specialisation(monkeypatch):
    calls = []
    orig = kernels.JaxKernel._export

    def counting(self, *a):
        calls.append(self.name)
        return orig(self, *a)

    monkeypatch.setattr(kernels.JaxKernel, "_export", counting)
    a, b = torch.randn(16, 48).tpu(), torch.randn(48, 16).tpu()
    for _ in range(3):
        ex.pallas_matmul(a, b)
    ex.pallas_matmul(a, b, 8)  # another static argument: another export
    assert calls == ["examples::pallas_matmul"] * 2


# ---------------------------------------------------------------- mutation and donation
def axpy_text(x, y, a):
    t = x.mlir
    return f"""func.func @main(%x: {t}, %y: {t}) -> ({t}, {t}) {{
    %a = stablehlo.constant dense<{a:.6e}> : {t}
    %ax = stablehlo.multiply %a, %x : {t}
    %new_y = stablehlo.add %ax, %y : {t}
    %d = stablehlo.subtract %y, %x : {t}
    return %d, %new_y : {t}, {t}
}}"""


axpy = kernels.stablehlo_op("tests::axpy_", axpy_text, schema="(Tensor x, Tensor y, float a) -> Tensor",
                            mutates_args=("y",))


def double_text(x):
    return f"""func.func @main(%x: {x.mlir}) -> {x.mlir} {{
    %r = stablehlo.add %x, %x : {x.mlir}
    return %r : {x.mlir}
}}"""


double_donating = kernels.stablehlo_op("tests::double_donating", double_text, schema="(Tensor x) -> Tensor",
                                       donate=("x",))


@pytest.mark.parametrize("mode", [E.DEFER_NEVER, E.DEFER_AND_FUSE])
def test_mutated_argument_is_written_in_place(mode):
    x, y = torch.arange(4.0), torch.ones(2, 4)
    with torch_tpu.eager_mode(mode):
        yt = y.tpu()
        row = yt[1]  # a view of the written storage sees the write
        d = axpy(x.tpu(), row, 2.0)
        assert axpy.schema.arguments[1].alias_info.is_write
        torch.testing.assert_close(d.cpu(), torch.ones(4) - x)
        torch.testing.assert_close(yt.cpu(), torch.stack([torch.ones(4), 2 * x + 1]))


def test_mutation_bumps_the_version_counter_for_autograd():
    w = torch.ones(4).tpu().requires_grad_()
    y = torch.ones(4).tpu()
    z = (w * y).sum()  # saves y for the backward
    axpy(torch.ones(4).tpu(), y, 2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_mutated_argument_under_torch_compile(fresh_dynamo):
    @torch.compile(fullgraph=True)
    def f(x, y):
        return axpy(x, y, 3.0) * 2

    x, y = torch.arange(4.0), torch.ones(4)
    yt = y.tpu()
    settle()
    out = f(x.tpu(), yt)
    torch.testing.assert_close(out.cpu(), 2 * (y - x))
    torch.testing.assert_close(yt.cpu(), 3 * x + 1)
    assert torch_tpu.metrics.report()["compiled_eager_nodes"] == 0


def test_donated_input_is_reused_and_invalid_afterwards():
    xt = torch.arange(6.0).tpu()
    settle()
    before = torch_tpu._C.buffer_bytes()
    r = double_donating(xt)
    torch.tpu.synchronize()
    assert "tf.aliasing_output" in torch_tpu._C.last_program()  # the output took the input's buffer
    assert torch_tpu._C.buffer_bytes() == before
    torch.testing.assert_close(r.cpu(), 2 * torch.arange(6.0))
    assert xt.shape == (6,)  # metadata stays; any use of the data raises
    for use in (lambda: xt + 1, lambda: xt.cpu(), lambda: print(xt), lambda: double_donating(xt)):
        with pytest.raises(RuntimeError, match="donated to the kernel tests::double_donating"):
            use()
    torch.testing.assert_close((r + 1).cpu(), 2 * torch.arange(6.0) + 1)  # the process carries on


def test_donated_view_is_invalidated_but_its_base_is_kept():
    base = torch.arange(8.0).tpu()
    v = base[2:6]
    r = double_donating(v)
    torch.testing.assert_close(r.cpu(), 2 * torch.arange(2.0, 6.0))
    torch.testing.assert_close(base.cpu(), torch.arange(8.0))  # other tensors on the storage keep it
    with pytest.raises(RuntimeError, match="donated"):
        v.sum()


def test_donation_is_left_to_the_program_under_torch_compile(fresh_dynamo):
    f = torch.compile(lambda x: double_donating(x) + 1, fullgraph=True)
    xt = torch.arange(4.0).tpu()
    torch.testing.assert_close(f(xt).cpu(), 2 * torch.arange(4.0) + 1)
    torch.testing.assert_close(xt.cpu(), torch.arange(4.0))  # functional inside a compiled graph


# ---------------------------------------------------------------- bad kernels
def module(body, args="%x: tensor<4xf32>", ret="tensor<4xf32>"):
    return f"module {{\n  func.func public @main({args}) -> {ret} {{\n{body}\n  }}\n}}"


GOOD = module("    %y = stablehlo.add %x, %x : tensor<4xf32>\n    return %y : tensor<4xf32>")


def bad_call(name, text, schema="(Tensor x) -> Tensor", outputs=None, x=None):
    k = kernels.stablehlo_op(name, text, schema=schema, outputs=outputs)
    x = torch.ones(4).tpu() if x is None else x
    with pytest.raises(KernelError) as e:
        k(*x) if isinstance(x, tuple) else k(x)
    # the process carries on, and so does the device
    torch.testing.assert_close((torch.ones(4).tpu() * 3).cpu(), torch.full((4,), 3.0))
    return str(e.value)


def test_invalid_text_is_a_clear_error():
    msg = bad_call("tests::bad_text", GOOD.replace("stablehlo.add", "stablehlo.addd"))
    assert "tests::bad_text" in msg and "does not compile" in msg and "stablehlo.addd" in msg
    msg = bad_call("tests::not_mlir", "this is not StableHLO")
    assert "tests::not_mlir" in msg


def test_output_shape_mismatch_with_declaration_is_a_clear_error():
    msg = bad_call("tests::wrong_outputs", GOOD, outputs=[TensorSpec((5,), torch.float32)])
    assert "@main returns (tensor<4xf32>), but the op expects (tensor<5xf32>)" in msg


def test_wrong_arity_and_input_types_are_clear_errors():
    msg = bad_call("tests::arity", GOOD, schema="(Tensor x, Tensor y) -> Tensor",
                   x=(torch.ones(4).tpu(), torch.ones(4).tpu()))
    assert "@main takes 1 arguments, but the op passes 2 tensors (x, y)" in msg
    msg = bad_call("tests::input_type", GOOD, x=torch.ones(3).tpu())
    assert "argument for x is tensor<4xf32>, but x is tensor<3xf32>" in msg
    msg = bad_call("tests::result_count", GOOD, schema="(Tensor x) -> (Tensor, Tensor)")
    assert "@main returns 1 values; the op has 2 outputs" in msg


def test_unsupported_custom_call_is_a_clear_error():
    text = module('    %y = stablehlo.custom_call @no_such_kernel(%x) : (tensor<4xf32>) -> tensor<4xf32>\n'
                  '    return %y : tensor<4xf32>')
    msg = bad_call("tests::custom_call", text)
    assert "no_such_kernel" in msg and "custom_call targets" in msg


def test_bad_kernel_inside_a_deferred_graph_leaves_the_graph_usable():
    k = kernels.stablehlo_op("tests::bad_deferred", GOOD.replace("%x, %x", "%x, %zz"),
                             schema="(Tensor x) -> Tensor")
    with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        y = torch.ones(4).tpu() * 2  # pending
        with pytest.raises(KernelError):
            k(y)
        torch.testing.assert_close((y + 1).cpu(), torch.full((4,), 3.0))


@needs_jax
def test_jax_function_that_cannot_be_exported_is_a_clear_error():

    @kernels.jax_op("tests::jax_broken")
    def broken(x: "jax.Array") -> "jax.Array":
        return x @ x  # (3, 4) @ (3, 4): the shapes do not fit

    with pytest.raises(KernelError, match="tests::jax_broken: jax.export failed"):
        broken(torch.ones(3, 4).tpu())


@needs_jax
def test_jax_arguments_the_function_does_not_use_are_still_arguments():

    @kernels.jax_op("tests::jax_unused")
    def f(x: "jax.Array", unused: "jax.Array", y: "jax.Array") -> "tuple[jax.Array, jax.Array]":
        return x * 2, y + 1  # jax.export drops `unused` from the module's @main

    x, y = torch.arange(3.0), torch.arange(4.0)
    a, b = f(x.tpu(), torch.ones(5).tpu(), y.tpu())
    torch.testing.assert_close(a.cpu(), x * 2)
    torch.testing.assert_close(b.cpu(), y + 1)


def test_registration_errors():
    with pytest.raises(ValueError, match="namespace::op"):
        kernels.stablehlo_op("no_namespace", GOOD, schema="(Tensor x) -> Tensor")
    with pytest.raises(ValueError, match="bad schema"):
        kernels.stablehlo_op("tests::bad_schema", GOOD, schema="(Tensor x) ->")
    with pytest.raises(KernelError, match="already registered"):
        kernels.stablehlo_op("examples::rmsnorm", GOOD, schema="(Tensor x) -> Tensor")
    with pytest.raises(KernelError, match="needs a type annotation"):
        kernels.jax_op("tests::unannotated", lambda x: x)


# ---------------------------------------------------------------- without JAX
NO_JAX = r"""
import sys
import torch, torch_tpu
from torch_tpu import kernels
assert not any(m == "jax" or m.startswith("jax.") for m in sys.modules), "import torch_tpu imported JAX"
sys.modules["jax"] = None  # from here on, any `import jax` fails
sys.path.insert(0, sys.argv[1])
import custom_kernels as ex  # defining the JAX kernels needs no JAX either
x, w = torch.randn(4, 32), torch.randn(32)
torch.testing.assert_close(ex.rmsnorm(x.tpu(), w.tpu(), 1e-6).cpu(), ex.rmsnorm_reference(x, w, 1e-6))
print("STABLEHLO OK")
if sys.argv[2] == "0":
    sys.exit(0)
a, b = torch.randn(16, 32), torch.randn(32, 16)
torch.testing.assert_close(ex.pallas_matmul(a.tpu(), b.tpu()).cpu(), a @ b, rtol=1e-4, atol=1e-4)  # cached
try:
    ex.pallas_matmul(torch.ones(32, 32).tpu(), torch.ones(32, 32).tpu())  # not cached
    print("NO ERROR")
except kernels.KernelError as e:
    print("ERROR", e)
print("OK", sys.modules["jax"] is None)
"""


def test_stablehlo_and_cached_jax_kernels_run_without_jax(tmp_path):
    have_jax = importlib.util.find_spec("jax") is not None
    if have_jax:  # export the Pallas kernel into this cache directory for the subprocess
        a, b = torch.randn(16, 32).tpu(), torch.randn(32, 16).tpu()
        saved = dict(ex.pallas_matmul._specs)
        torch_tpu._C._set_cache_dir(str(tmp_path))
        try:
            ex.pallas_matmul._specs.clear()
            ex.pallas_matmul(a, b)
        finally:
            torch_tpu._C._set_cache_dir("")
            ex.pallas_matmul._specs.update(saved)
        assert len(list((tmp_path / "kernels").glob("*.json"))) == 1
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path), PYTHONPATH=os.path.abspath(ROOT))
    out = subprocess.run([sys.executable, "-c", NO_JAX, os.path.join(ROOT, "examples"), str(int(have_jax))],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "STABLEHLO OK" in out.stdout, out.stdout
    if have_jax:  # the cached kernel ran; an uncached shape asks for JAX
        assert "OK True" in out.stdout, out.stdout
        assert "ERROR kernel examples::pallas_matmul: JAX is needed to export" in out.stdout, out.stdout


# ---------------------------------------------------------------- Helion
try:  # Helion kernels must be module-level functions (no closures)
    import helion
    import helion.language as hl
except ImportError:
    helion = None

if helion is not None:
    @helion.kernel(backend="pallas", pallas_interpret=True, config=helion.Config(block_sizes=[8, 8]))
    def helion_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for tile in hl.tile(x.size()):
            out[tile] = x[tile] + y[tile]
        return out


@pytest.mark.skipif(helion is None, reason="Helion (PyPI helion, Pallas backend) is not a test dependency: it pulls "
                    "scikit-learn and SciPy; docs/KERNELS.md has the recipe this test checks when it is installed")
def test_helion_kernel_through_jax_fn():
    k = kernels.jax_op("tests::helion_add", helion_add.jax_fn, schema="(Tensor x, Tensor y) -> Tensor",
                       cache_key="tests::helion_add v1")
    x, y = torch.randn(16, 16), torch.randn(16, 16)
    with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        got = (k(x.tpu(), y.tpu()) * 2).cpu()  # fused with the op after it
    torch.testing.assert_close(got, (x + y) * 2)
