"""OpInfo parity: PyTorch's own op_db samples run on tpu and on CPU, compared.

Used by tests/ops/test_opinfo.py (CI) and by
  python tests/ops/opinfo_parity.py [--samples K] [--ops name,...] [--markdown]
which writes the per-entry table in docs/OP_COVERAGE.md.

For every op_db entry that supports the dtype (float32 by default; --dtype
bfloat16 / int64 / bool / uint8 / int8 / int16 for the other sweeps), up to K sample inputs run on CPU
and on tpu (matmul-like ops at HIGHEST precision) and are compared in value,
dtype and shape. For float32 entries that support autograd, the gradients of
the sample's inputs (for random output weights) are compared too (--grad). An
entry is
  pass      every sample matched and no ATen op fell back to the CPU,
  fallback  every sample matched, some ATen op ran on the CPU fallback,
  fail      a sample differed or raised on tpu but not on CPU (reason recorded),
  skip      no float32 support or no sample ran on CPU (reason recorded).

Two more sweeps go beyond the happy path:
  --reference  the entry's reference inputs (extremal values: nan, inf, large,
               empty, 0-d) instead of its sample inputs: per entry the first
               sample with a nan/inf, the first with large values and the first
               empty or 0-d one (--samples 0: every reference input);
  --errors     the entry's error inputs: tpu must raise the exception type CPU
               raises, with a message matching the entry's regex.
  --dynamic    bounded dynamism: the dims (size >= 2) of every tpu input are made
               dynamic at a bucket of a ladder that no typical size is a step of (so the
               padding is exercised; all dims, all but the last, the first only, in turn),
               every rule is allowed to run at the bounds, and results (and with --grad the
               input gradients) are compared with CPU. Per ATen op it reports whether
               it ran bucketed and always matched; --emit-rules prints those rules for
               csrc/lowering/dynamic_rules.cc.
"""
import argparse
import contextlib
import io
import json
import collections
import os
import re
import sys
import time
import warnings

import torch

import torch_tpu

REASONS = {
    # entries whose CPU reference itself is not deterministic or not comparable
    "bernoulli": "random: CPU and tpu generators differ",
    "normal": "random: CPU and tpu generators differ",
    "rand_like": "random: CPU and tpu generators differ",
    "randint_like": "random: CPU and tpu generators differ",
    "randn_like": "random: CPU and tpu generators differ",
    "randint": "random: CPU and tpu generators differ",
    "uniform": "random: CPU and tpu generators differ",
    "cauchy": "random: CPU and tpu generators differ",
    "exponential": "random: CPU and tpu generators differ",
    "geometric": "random: CPU and tpu generators differ",
    "log_normal": "random: CPU and tpu generators differ",
    "multinomial": "random: CPU and tpu generators differ",
    "nn.functional.dropout": "random: CPU and tpu generators differ",
    "nn.functional.dropout2d": "random: CPU and tpu generators differ",
    "nn.functional.dropout3d": "random: CPU and tpu generators differ",
    "nn.functional.alpha_dropout": "random: CPU and tpu generators differ",
    "nn.functional.feature_alpha_dropout": "random: CPU and tpu generators differ",
    "nn.functional.rrelu": "random: CPU and tpu generators differ",
    "nn.functional.fractional_max_pool2d": "random: CPU and tpu generators differ",
    "nn.functional.fractional_max_pool3d": "random: CPU and tpu generators differ",
    "nn.functional.multi_head_attention_forward": "random: some samples train with dropout",
    "empty": "uninitialised memory", "empty_like": "uninitialised memory", "new_empty": "uninitialised memory",
    "empty_strided": "uninitialised memory", "new_empty_strided": "uninitialised memory",
    "empty_permuted": "uninitialised memory",
}


# Entries that fail for a documented limitation (they raise a clear error on tpu).
EXPECTED_FAIL = {
    "sparse.sampled_addmm": "sparse layouts are not supported on tpu",
    "sparse.mm.reduce": "sparse layouts are not supported on tpu",
    "to_sparse": "sparse layouts are not supported on tpu",
    "chalf": "complex32 is not supported on tpu",
    "tensor_split": "this harness moves the CPU-only index tensor of the sample to tpu; PyTorch requires it on CPU",
    "as_strided.partial_views": "the sample reads storage outside its view, which .to('tpu') does not copy",
    "native_batch_norm": "eval samples: PyTorch's Meta kernel sizes save_mean/save_invstd [C], its CPU kernel [0]",
    "_native_batch_norm_legit": "eval samples: PyTorch's Meta kernel sizes save_mean/save_invstd [C], its CPU kernel [0]",
}

# error inputs (entry, error regex; "*": all of the entry's) whose error differs on tpu, with the reason
EXPECTED_ERROR_FAIL = {
}

# entries whose input gradients differ from CPU's, each with the reason
EXPECTED_GRAD_FAIL = {
}

_RANDOM_PROJECTION = "random: the projection is drawn by the device's generator (CPU and tpu generators differ)"
_TIES = "the order of equal elements is unspecified (CPU and tpu pick different ones among ties)"
_CPU_BF16_STATS = "CPU returns bfloat16 mean/invstd for bfloat16 input; CUDA and PyTorch's Meta kernel (which tpu follows) float32"
_BF16_SUMS = "bfloat16 products accumulated in another order than CPU's kernel; differences exceed bf16 tolerance"
# per dtype sweep: entries that fail for a documented reason (beyond EXPECTED_FAIL's layout/dtype entries)
EXPECTED_FAIL_BY_DTYPE = {
    torch.bfloat16: {
        "topk": _TIES, "sort": _TIES, "argsort": _TIES,
        "native_layer_norm": _CPU_BF16_STATS, "native_batch_norm": _CPU_BF16_STATS,
        "_native_batch_norm_legit": _CPU_BF16_STATS, "_batch_norm_with_update": _CPU_BF16_STATS,
        "addbmm": _BF16_SUMS, "nn.functional.conv_transpose2d": _BF16_SUMS, "nn.functional.conv_transpose3d": _BF16_SUMS,
    },
    torch.int64: {"topk": _TIES, "kthvalue": _TIES},
    torch.uint8: {"topk": _TIES, "kthvalue": _TIES, "sort": _TIES, "argsort": _TIES},
    torch.int8: {"topk": _TIES, "kthvalue": _TIES, "sort": _TIES, "argsort": _TIES},
    torch.int16: {"topk": _TIES, "kthvalue": _TIES, "sort": _TIES, "argsort": _TIES},
    torch.complex64: {"svd_lowrank": _RANDOM_PROJECTION, "pca_lowrank": _RANDOM_PROJECTION},
    torch.complex128: {"svd_lowrank": _RANDOM_PROJECTION, "pca_lowrank": _RANDOM_PROJECTION},
    torch.bool: {"sort": _TIES, "argsort": _TIES,
                 "special.zeta": "zeta(x, q) at the poles x = 1 / q = 0 of bool inputs: inf vs nan"},
}


# reference inputs (extremal values) per dtype: entries that fail for a documented reason
_FLOAT_TO_INT = ("float -> integer conversion of NaN, inf and out-of-range values is undefined in C++: CPU returns "
                 "x86's INT_MIN pattern (wrapped to 8/16 bits), tpu saturates as XLA and CUDA do")
_CASTS = {n: _FLOAT_TO_INT for n in ("byte", "char", "short", "int", "long")}
# beyond CI's 3 extremal inputs per entry: failures of the full reference sweep (TORCH_TPU_OPINFO_FULL=1)
_FULL_ONLY = {
    "nn.functional.scaled_dot_product_attention": "random: samples with dropout_p > 0 (CPU and tpu generators differ)",
    "svd_lowrank": _RANDOM_PROJECTION,
    "nn.functional.interpolate.bilinear": "source coordinates rounded in float32 as on CPU, but not bit-identically: "
                                          "at 345 -> 270 rows the blend weights differ by ~1e-5 (both results are "
                                          "~9e-5 from float64), beyond the 1e-4 tolerance",
}
_BF16_COMPOSITE = "composite of bfloat16 ops (each rounded) where CPU's kernel rounds once: one element in cancellation"
_FULL_ONLY_BF16 = {
    **_FULL_ONLY, "topk": _TIES, "sort": _TIES, "argsort": _TIES, "mode": _TIES,
    "addr": _BF16_COMPOSITE, "nn.functional.instance_norm": _BF16_COMPOSITE,
    "nn.functional.upsample_bilinear": _FULL_ONLY["nn.functional.interpolate.bilinear"],
    "histc": "bfloat16 values on bin edges land in the neighbouring bin (edges rounded differently than CPU's)",
    "nn.functional.grid_sample": "runs on the CPU fallback; CPU's bfloat16 grid_sampler_2d returns garbage (~1e22) "
                                 "for grid points far outside [-1, 1], different on each call",
}
EXPECTED_REFERENCE_FAIL = {
    torch.float32: {**_CASTS, **_FULL_ONLY,
                    "special.zeta": "CPU sums zeta(x, q) in float64 for float32 input: at x = 501, q < 0 "
                                    "its terms overflow float32 (inf - inf) where CPU's do not"},
    torch.bfloat16: {**_CASTS, **_FULL_ONLY_BF16},
}


def expected_fail(name, dtype=torch.float32, inputs="sample"):
    why = EXPECTED_FAIL.get(name) or EXPECTED_FAIL_BY_DTYPE.get(dtype, {}).get(name)
    if inputs == "reference":
        why = why or EXPECTED_REFERENCE_FAIL.get(dtype, {}).get(name)
    return why


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    return [x]


TOL = {torch.float32: 1e-4, torch.complex64: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float64: 1e-4, torch.complex128: 1e-4}


def _compare(a, b, tol=1e-4):
    fa, fb = _flat(a), _flat(b)
    if len(fa) != len(fb):
        return f"different number of results ({len(fa)} vs {len(fb)})"
    for x, y in zip(fa, fb):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor):
                return f"result is {type(x).__name__}, expected a tensor"
            if x.dtype != y.dtype:
                return f"dtype {x.dtype} vs {y.dtype}"
            if x.shape != y.shape:
                return f"shape {tuple(x.shape)} vs {tuple(y.shape)}"
            xc = x.cpu()
            t = tol if y.dtype in (torch.float32, torch.complex64) else TOL.get(y.dtype, 0)  # by result type
            try:
                torch.testing.assert_close(xc, y, rtol=t, atol=t, equal_nan=True)
            except AssertionError as e:
                return "values differ: " + str(e).splitlines()[0][:120]
        elif x != y and not (isinstance(x, float) and x != x and y != y):
            return f"value {x!r} vs {y!r}"
    return None


FALLBACK_OPS = set()  # ATen ops that ran on the CPU fallback during the last entry


def _grad_sample(op, s):
    """Input gradients of one sample on CPU and on tpu, for the same random output
    weights: (cpu grads, tpu grads, fell back) or None when nothing is differentiable."""
    leaves = [t for t in _flat([s.input, list(s.args), list(s.kwargs.values())])
              if isinstance(t, torch.Tensor) and t.requires_grad]
    if not leaves:
        return None
    out = op(s.input, *s.args, **s.kwargs)
    keep = [i for i, o in enumerate(_flat(out)) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not keep:
        return None
    outs = [_flat(out)[i] for i in keep]
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    expected = torch.autograd.grad(outs, leaves, ws, allow_unused=True)
    mapping = {id(t): t.detach().to("tpu").requires_grad_() for t in leaves}

    def move(x):
        if isinstance(x, torch.Tensor):
            return mapping[id(x)] if id(x) in mapping else x.detach().to("tpu")
        if isinstance(x, (list, tuple)):
            return type(x)(move(v) for v in x)
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x

    torch_tpu.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out_t = op(move(s.input), *move(tuple(s.args)), **move(dict(s.kwargs)))
        outs_t = [_flat(out_t)[i] for i in keep]
        actual = torch.autograd.grad(outs_t, [mapping[id(t)] for t in leaves], [w.to(o.device) for w, o in zip(ws, outs_t)],
                                     allow_unused=True)
    fb = torch_tpu.metrics.cpu_fallbacks()
    FALLBACK_OPS.update(fb.keys())
    return expected, [None if a is None else a.cpu() for a in actual], bool(fb)


def run_grads(op, samples):
    """'pass' | 'fallback' | 'fail' | 'skip' for the input gradients of an entry (float32)."""
    FALLBACK_OPS.clear()
    if not op.supports_autograd or torch.float32 not in op.supported_backward_dtypes("cpu"):
        return "skip", "no float32 autograd"
    try:
        sample_list = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:samples]
    except Exception as e:  # noqa: BLE001
        return "skip", f"sample generation failed: {type(e).__name__}"
    ran, fell_back = 0, False
    for s in sample_list:
        try:
            r = _grad_sample(op, s)
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e).splitlines()[0][:400]}" if str(e) else type(e).__name__
            # a CPU failure (nothing to compare) raises before the tpu part runs
            if "tpu" in msg or "torch_tpu" in msg:
                return "fail", "raised " + msg
            continue
        if r is None:
            continue
        expected, actual, fb = r
        ran += 1
        fell_back |= fb
        for e, a in zip(expected, actual):
            if (e is None) != (a is None):
                return "fail", "a gradient is missing on one side"
            if e is not None:
                err = _compare(a, e, 1e-3)
                if err:
                    return "fail", "gradient " + err
    if ran == 0:
        return "skip", "no differentiable sample"
    return ("fallback" if fell_back else "pass"), ", ".join(sorted(FALLBACK_OPS))


def entry_name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


_OP_DB = None


def op_entries():
    """[(entry name, OpInfo)] over PyTorch's op_db."""
    global _OP_DB
    if _OP_DB is None:
        from torch.testing._internal.common_methods_invocations import op_db

        _OP_DB = [(entry_name(op), op) for op in op_db]
    return _OP_DB


def _tensors(s):
    return [t for t in _flat([s.input, list(s.args), list(s.kwargs.values())]) if isinstance(t, torch.Tensor)]


def _is_nonfinite(t):
    return (t.is_floating_point() or t.is_complex()) and t.numel() > 0 and not bool(torch.isfinite(t).all())


def _is_large(t):
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0 or not bool(torch.isfinite(t).all()):
        return False
    return float(t.abs().max()) > 1e4


# the extremal kinds of reference inputs, in the order they are picked
EXTREMAL_KINDS = (
    ("nan/inf", lambda ts: any(_is_nonfinite(t) for t in ts)),
    ("large", lambda ts: any(_is_large(t) for t in ts)),
    ("empty/0-d", lambda ts: any(t.numel() == 0 or t.dim() == 0 for t in ts)),
)


def reference_samples(op, dtype, samples):
    """The entry's reference inputs with extremal values: the first sample of each
    kind in EXTREMAL_KINDS (a sample counts once), at most `samples` of them;
    samples=0: every reference input."""
    it = op.reference_inputs("cpu", dtype, requires_grad=False)
    if samples == 0:
        return list(it)
    kinds = EXTREMAL_KINDS[:samples]
    found = {}
    for s in it:
        ts = _tensors(s)
        for kind, has in kinds:
            if kind not in found and has(ts):
                found[kind] = s
                break
        if len(found) == len(kinds):
            break
    return [found[k] for k, _ in kinds if k in found]


def run_entry(op, samples, dtype=torch.float32, inputs="sample"):
    """(entry, 'pass' | 'fallback' | 'fail' | 'skip', reason) for up to `samples`
    sample inputs (inputs="sample") or extremal reference inputs (inputs="reference")."""
    FALLBACK_OPS.clear()
    name = entry_name(op)
    if os.environ.get("TT_OPINFO_TRACE"):
        print("running", name, file=sys.stderr, flush=True)
    if op.name in REASONS:
        return name, "skip", REASONS[op.name]
    if dtype not in op.supported_dtypes("cpu"):
        return name, "skip", f"no {dtype} support"
    ran, fell_back = 0, False
    try:
        if inputs == "reference":
            sample_list = reference_samples(op, dtype, samples)
        else:
            sample_list = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:samples]
    except Exception as e:  # noqa: BLE001
        return name, "skip", f"sample generation failed: {type(e).__name__}"
    for s in sample_list:
        args = (s.input,) + tuple(s.args)
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = op(*args, **s.kwargs)
        except Exception:  # noqa: BLE001  CPU rejects the sample too: nothing to compare
            continue
        torch_tpu.metrics.reset()
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                actual = op(*_to(args, "tpu"), **_to(s.kwargs, "tpu"))
                actual = _to(actual, "cpu")
        except Exception as e:  # noqa: BLE001
            return name, "fail", f"raised {type(e).__name__}: {str(e).splitlines()[0][:400] if str(e) else ''}"
        ran += 1
        fb = torch_tpu.metrics.cpu_fallbacks()
        fell_back |= bool(fb)
        FALLBACK_OPS.update(fb.keys())
        err = _compare(actual, expected, 1e-4)
        if err:
            return name, "fail", err
    if ran == 0:
        if inputs == "reference" and not sample_list:
            return name, "skip", "no extremal reference input (nan/inf, large, empty or 0-d)"
        return name, "skip", "no sample ran on CPU"
    return name, ("fallback" if fell_back else "pass"), ", ".join(sorted(FALLBACK_OPS))


def _to_keep_grad(x, device, shared=None):
    """_to for CPU tensors, keeping requires_grad of floating leaves (some error inputs
    are about autograd); tensors on other devices (meta) stay where they are. Tensors
    of x that share a CPU storage share one device storage too, at the same offsets
    and strides, and expanded tensors stay expanded (memory-overlap error inputs:
    `op(x, out=x[1:])`, `op(x, out=y.expand(3))`)."""
    if shared is None:
        counts = collections.Counter(
            (t.untyped_storage().data_ptr(), t.dtype) for t in _flat_all(x)
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.untyped_storage().nbytes())
        shared = {k: None for k, n in counts.items() if n > 1}
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            return x
        key = (x.untyped_storage().data_ptr(), x.dtype)
        if torch._debug_has_internal_overlap(x) == 1:  # expanded: .to() would make it dense
            shared.setdefault(key, None)
        if key in shared:
            if shared[key] is None:  # the whole storage, moved once
                whole = torch.tensor([], dtype=x.dtype).set_(x.untyped_storage())
                shared[key] = whole.detach().to(device)
            y = shared[key].as_strided(x.size(), x.stride(), x.storage_offset())
        else:
            y = x.detach().to(device)
        return y.requires_grad_() if x.requires_grad and (y.is_floating_point() or y.is_complex()) else y
    if isinstance(x, (list, tuple)):
        return type(x)(_to_keep_grad(v, device, shared) for v in x)
    if isinstance(x, dict):
        return {k: _to_keep_grad(v, device, shared) for k, v in x.items()}
    return x


def _flat_all(x):
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat_all(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat_all(v)]
    return [x]


def _raises(fn):
    """The exception fn() raises (results are read back, so deferred errors count), or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _to(fn(), "cpu")
    except Exception as e:  # noqa: BLE001
        return e
    return None


def _one_line(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:400] if str(e) else ''}"


def run_errors(op):
    """[(entry, error regex, 'pass' | 'fail' | 'skip', detail)] for each of the
    entry's error inputs: pass when tpu raises the type CPU raises with a message
    matching the regex; skip when CPU itself does not raise as the entry describes."""
    name = entry_name(op)
    if op.error_inputs_func is None:
        return []
    try:
        eis = list(op.error_inputs("cpu"))
    except Exception as e:  # noqa: BLE001
        return [(name, "", "skip", f"error input generation failed: {type(e).__name__}")]
    out = []
    for ei in eis:
        si, rx = ei.sample_input, str(ei.error_regex)
        if os.environ.get("TT_OPINFO_TRACE"):
            print("error input", name, rx, file=sys.stderr, flush=True)
        ce = _raises(lambda: op(si.input, *si.args, **si.kwargs))
        if ce is None or not isinstance(ce, ei.error_type) or not re.search(rx, str(ce)):
            out.append((name, rx, "skip", "CPU does not raise as described: " + (_one_line(ce) if ce else "no error")))
            continue
        def on_tpu():
            args, kwargs = _to_keep_grad(((si.input,) + tuple(si.args), si.kwargs), "tpu")
            return op(*args, **kwargs)
        te = _raises(on_tpu)
        if te is None:
            out.append((name, rx, "fail", "no error on tpu"))
        elif type(te) is not type(ce) or not re.search(rx, str(te)):
            out.append((name, rx, "fail", f"raised {_one_line(te)}; CPU {_one_line(ce)}"))
        else:
            out.append((name, rx, "pass", ""))
    return out


def expected_error_fail(name, regex):
    return EXPECTED_ERROR_FAIL.get((name, regex)) or EXPECTED_ERROR_FAIL.get((name, "*"))


def run_all(samples=2, only=None, dtype=torch.float32, grads=False, inputs="sample", on_result=None):
    """[(entry, result, reason)], or with grads [(entry, result, reason, grad result, grad reason)];
    on_result(r) is called as each entry finishes."""
    results = []
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        for name, op in op_entries():
            if only and op.name not in only and name not in only:
                continue
            r = run_entry(op, samples, dtype, inputs)
            if grads:
                g = ("skip", r[2]) if r[1] in ("skip", "fail") or op.name in REASONS else run_grads(op, samples)
                r = r + g
            results.append(r)
            if on_result:
                on_result(r)
    return results


def run_all_errors(only=None):
    results = []
    for name, op in op_entries():
        if only and op.name not in only and name not in only:
            continue
        results += run_errors(op)
    return results


def error_summary(results):
    return {k: sum(1 for r in results if r[2] == k) for k in ("pass", "fail", "skip")}


def summary(results):
    counts = {k: sum(1 for r in results if r[1] == k) for k in ("pass", "fallback", "fail", "skip")}
    tested = counts["pass"] + counts["fallback"] + counts["fail"]
    return counts, tested


def grad_summary(results):
    return {k: sum(1 for r in results if len(r) > 3 and r[3] == k) for k in ("pass", "fallback", "fail", "skip")}


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64, "bool": torch.bool,
          "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "uint16": torch.uint16,
          "uint32": torch.uint32, "uint64": torch.uint64, "complex64": torch.complex64,
          "complex128": torch.complex128, "float64": torch.float64}


# ---------------------------------------------------------------- bounded dynamism
# The bucket ladder of the sweep: no typical OpInfo size (1-5, 10, 20, 25, ...) is a step, so every
# dynamic dim carries padding that a rule must not see.
DYNAMIC_STEPS = [6, 7, 9, 13, 17, 23, 33, 47, 65, 97, 129, 257, 513, 1025]
# which dims are dynamic: all of every input, all but the last (a normalized or feature dim),
# the first only (a batch); "input": the first dim of the sample's first input only (weights stay static)
DYNAMIC_MARKINGS = ("all", "leading", "first", "input")


def _to_dynamic(x, leaves=None, marking="all"):
    """x on tpu with its dims of size >= 2 (of `marking`) dynamic at their bucket; CPU leaves
    that require grad become tpu leaves (recorded in `leaves`: cpu id -> tpu tensor)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tpu")
        dims = {"all": range(t.dim()), "leading": range(t.dim() - 1), "first": range(min(t.dim(), 1)),
                "static": ()}[marking]
        for d in dims:
            if t.size(d) >= 2:
                torch_tpu.mark_dynamic(t, d)
        if leaves is not None and x.requires_grad:
            t.requires_grad_()
            leaves[id(x)] = t
        return t
    if isinstance(x, (list, tuple)):
        return type(x)(_to_dynamic(v, leaves, marking) for v in x)
    if isinstance(x, dict):
        return {k: _to_dynamic(v, leaves, marking) for k, v in x.items()}
    return x


def _random_sample(s):
    """A sample whose result depends on a random draw (dropout_p > 0): CPU and tpu differ."""
    return any(k in ("dropout_p", "p") and isinstance(v, float) and v > 0 for k, v in s.kwargs.items()) or \
        any(isinstance(v, float) and v > 0 for k, v in s.kwargs.items() if "dropout" in k)


def _dynamic_sample(op, s, marking, grads):
    """None when the sample matches CPU with its inputs dynamic (`marking`), else the reason; and
    the ops that ran at a bucket. Raises _CpuRejects when CPU rejects the sample."""
    args = (s.input,) + tuple(s.args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = op(*args, **s.kwargs)
            leaves_cpu = [t for t in _flat([args, list(s.kwargs.values())]) if isinstance(t, torch.Tensor) and t.requires_grad]
            outs = [o for o in _flat(expected) if isinstance(o, torch.Tensor) and o.requires_grad]
            ws = [torch.randn(o.shape, generator=torch.Generator().manual_seed(0)) for o in outs]
            eg = torch.autograd.grad(outs, leaves_cpu, ws, allow_unused=True) if grads and outs and leaves_cpu else None
    except Exception:  # noqa: BLE001  CPU rejects the sample: nothing to compare
        raise _CpuRejects() from None
    torch_tpu.metrics.reset()
    leaves = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if marking == "input":
                first = _to_dynamic(args[0], leaves, "first")
                actual = op(first, *_to_dynamic(args[1:], leaves, "static"), **_to_dynamic(dict(s.kwargs), leaves, "static"))
            else:
                actual = op(*_to_dynamic(args, leaves, marking), **_to_dynamic(dict(s.kwargs), leaves, marking))
            ag = None
            if eg is not None:
                outs_t = [o for o in _flat(actual) if isinstance(o, torch.Tensor) and o.requires_grad]
                ag = torch.autograd.grad(outs_t, [leaves[id(t)] for t in leaves_cpu], [w.to("tpu") for w in ws],
                                         allow_unused=True)
                ag = [None if a is None else a.cpu() for a in ag]
            actual = _to(actual, "cpu")
    except Exception as e:  # noqa: BLE001
        return f"[{marking}] raised {type(e).__name__}: {_one_line(e)}", set(torch_tpu.metrics.report()["bucketed_ops"])
    ops = set(torch_tpu.metrics.report()["bucketed_ops"])
    err = _compare(actual, expected.detach() if isinstance(expected, torch.Tensor) else expected, 1e-4)
    if err is None and eg is not None:
        for e_, a_ in zip(eg, ag):
            if (e_ is None) != (a_ is None):
                err = "a gradient is missing on one side"
            elif e_ is not None:
                err = _compare(a_, e_, 1e-3)
                err = err and "gradient " + err
            if err:
                break
    return (f"[{marking}] {err}" if err else None), ops


class _CpuRejects(Exception):
    pass


def run_dynamic(op, samples, grads=False):
    """(entry, result, reason, bucketed ops, guilty ops): result 'pass' when every sample
    matched CPU and some op ran at a bucket, 'static' when it matched but nothing ran at a
    bucket, 'fail' (each op that ran at a bucket in the failing sample is tried alone at its
    bucket: those that fail alone are guilty), 'skip' (nothing to compare)."""
    name = entry_name(op)
    if op.name in REASONS:
        return name, "skip", REASONS[op.name], [], []
    if torch.float32 not in op.supported_dtypes("cpu"):
        return name, "skip", "no float32 support", [], []
    grads = grads and op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu")
    try:
        sample_list = list(op.sample_inputs("cpu", torch.float32, requires_grad=grads))[:samples]
    except Exception as e:  # noqa: BLE001
        return name, "skip", f"sample generation failed: {type(e).__name__}", [], []
    bucketed, ran = set(), 0
    for s, marking in ((s, m) for s in sample_list if not _random_sample(s) for m in DYNAMIC_MARKINGS):
        try:
            err, ops = _dynamic_sample(op, s, marking, grads)
        except _CpuRejects:
            continue
        if err:
            guilty = []
            try:
                for o in sorted(ops):
                    torch_tpu._C._set_bucket_rules(2, [o])
                    if _dynamic_sample(op, s, marking, grads)[0]:
                        guilty.append(o)
            finally:
                torch_tpu._C._set_bucket_rules(1)
            return name, "fail", err, sorted(bucketed), guilty or sorted(ops)
        bucketed |= ops
        ran += 1
    if ran == 0:
        return name, "skip", "no sample ran on CPU", [], []
    return name, ("pass" if bucketed else "static"), "", sorted(bucketed), []


def run_all_dynamic(samples=2, only=None, grads=False, on_result=None):
    results = []
    torch_tpu._C._set_bucket_rules(1)
    steps = torch_tpu.dynamic.buckets()
    torch_tpu.dynamic.set_buckets(DYNAMIC_STEPS)
    try:
        with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
            for name, op in op_entries():
                if only and op.name not in only and name not in only:
                    continue
                r = run_dynamic(op, samples, grads)
                results.append(r)
                if on_result:
                    on_result(r)
    finally:
        torch_tpu._C._set_bucket_rules(0)
        torch_tpu.dynamic.set_buckets(steps)
    return results


def dynamic_rule_verdicts(results):
    """{aten op: (entries where it ran bucketed and matched, entries where it was a suspect)}"""
    good, bad = collections.defaultdict(set), collections.defaultdict(set)
    for name, rr, _, ops, failing in results:
        for o in ops:
            good[o].add(name)
        for o in failing:
            bad[o].add(name)
    return {o: (sorted(good[o]), sorted(bad[o])) for o in sorted(set(good) | set(bad))}


def main_dynamic(args, only, t0):
    res = run_all_dynamic(args.samples, only, args.grad, None if args.emit_rules else
                          (lambda r: print(f"{r[1]:7s} {r[0]} {r[2]} {' '.join(r[4] if r[1] == 'fail' else r[3])}", flush=True)))
    verdicts = dynamic_rule_verdicts(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"entries": res, "ops": verdicts}, f, indent=0)
    counts = collections.Counter(r[1] for r in res)
    clean = [o for o, (g, b) in verdicts.items() if g and not b]
    if args.emit_rules:
        for o in clean:
            print(f'      "{o}",')
    print(dict(counts), f"{len(clean)} ops bucketed and always matching, "
          f"{sum(1 for g, b in verdicts.values() if b)} suspects", f"{time.time() - t0:.0f}s", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--ops", default=None)
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--grad", action="store_true", help="also compare input gradients (float32)")
    ap.add_argument("--reference", action="store_true", help="extremal reference inputs instead of sample inputs")
    ap.add_argument("--errors", action="store_true", help="the entries' error inputs (type and message vs CPU)")
    ap.add_argument("--dynamic", action="store_true", help="bounded dynamism: inputs bucketed, vs CPU")
    ap.add_argument("--emit-rules", action="store_true", help="with --dynamic: print the rules that always matched")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.time()
    only = set(args.ops.split(",")) if args.ops else None
    if args.errors:
        return main_errors(args, only, t0)
    if args.dynamic:
        return main_dynamic(args, only, t0)
    inputs = "reference" if args.reference else "sample"
    def show(r):
        print(f"{r[1]:9s} {r[0]} {r[2]}" + (f"   [grad: {r[3]} {r[4]}]" if len(r) > 3 else ""), flush=True)

    res = run_all(args.samples, only, DTYPES[args.dtype], args.grad, inputs, None if args.markdown else show)
    counts, tested = summary(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=0)
    if args.markdown:
        grad_flag = " --grad" if args.grad else ""
        if args.reference:
            grad_flag += " --reference"
        what = "extremal reference inputs" if args.reference else "samples"
        print(f"## OpInfo parity ({args.dtype}, up to {args.samples} {what} per entry)\n")
        print(f"Command: `python tests/ops/opinfo_parity.py --samples {args.samples} --dtype {args.dtype}{grad_flag} "
              f"--markdown`; {time.time() - t0:.0f} s on the CPU plugin.\n")
        print("| result | entries |" + (" gradients |" if args.grad else "") + "\n|---|---|" + ("---|" if args.grad else ""))
        gs = grad_summary(res)
        for k, v in counts.items():
            print(f"| {k} | {v} |" + (f" {gs[k]} |" if args.grad else ""))
        print(f"\nOf {tested} tested {args.dtype} entries: {counts['pass']} pass natively "
              f"({100 * counts['pass'] / max(tested, 1):.0f}%), {counts['fallback']} pass through the CPU "
              f"fallback, {counts['fail']} fail.\n")
        if args.grad:
            gt = gs["pass"] + gs["fallback"] + gs["fail"]
            print(f"Gradients: of {gt} entries with differentiable float32 samples, {gs['pass']} match natively, "
                  f"{gs['fallback']} match with some backward op on the CPU fallback, {gs['fail']} differ.\n")
        print("| entry | result | reason |" + (" gradients |" if args.grad else "") + "\n|---|---|---|"
              + ("---|" if args.grad else ""))
        for r in res:
            name, rr, why = r[:3]
            if rr == "fail" and expected_fail(name, DTYPES[args.dtype], inputs):
                why = f"expected: {expected_fail(name, DTYPES[args.dtype], inputs)} ({why})"
            grad = ""
            if len(r) > 3:
                gwhy = r[4]
                if r[3] == "fail" and name in EXPECTED_GRAD_FAIL:
                    gwhy = f"expected: {EXPECTED_GRAD_FAIL[name]} ({gwhy})"
                grad = f" {r[3]}{(': ' + gwhy.replace('|', '/')) if r[3] in ('fail', 'fallback') else ''} |"
            print(f"| `{name}` | {rr} | {why.replace('|', '/')} |" + grad)
    else:
        print(counts, ("grad " + str(grad_summary(res))) if args.grad else "", f"{time.time() - t0:.0f}s")


def main_errors(args, only, t0):
    res = run_all_errors(only)
    counts = error_summary(res)
    tested = counts["pass"] + counts["fail"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=0)
    if args.markdown:
        print("## OpInfo error inputs (exception type and message vs CPU)\n")
        print(f"Command: `python tests/ops/opinfo_parity.py --errors --markdown`; {time.time() - t0:.0f} s on the CPU plugin.\n")
        print(f"Of {tested} error inputs that CPU rejects as described, tpu raises the same type with a matching "
              f"message for {counts['pass']} ({100 * counts['pass'] / max(tested, 1):.1f}%); {counts['skip']} more are "
              f"skipped because CPU itself does not raise as the entry describes.\n")
        print("| entry | error regex | result | detail |\n|---|---|---|---|")
        for name, rx, rr, why in res:
            if rr == "pass":
                continue
            if rr == "fail" and expected_error_fail(name, rx):
                why = f"expected: {expected_error_fail(name, rx)} ({why})"
            cell = rx.replace("|", "/")[:80]
            print(f"| `{name}` | `{cell}` | {rr} | {why.replace('|', '/')} |")
    else:
        for name, rx, rr, why in res:
            print(f"{rr:5s} {name} [{rx[:60]}] {why}")
        print(counts, f"{100 * counts['pass'] / max(tested, 1):.1f}% of {tested}", f"{time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
