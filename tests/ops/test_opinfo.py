"""OpInfo parity over PyTorch's op_db, one test per entry and sweep (`pytest -k add`
runs the entries whose name contains "add", `-k "Values_int8"` one sweep):

  values      sample inputs in float32 (with input gradients), bfloat16, int64,
              bool, uint8, int8, int16, uint16, uint32, uint64 (PyTorch's CPU
              kernels implement these three for few entries), complex64 and
              complex128;
  reference   extremal reference inputs (nan/inf, large, empty/0-d) in float32
              and bfloat16;
  errors      each entry's error inputs: the exception type CPU raises, with a
              message matching the entry's regex.

Every entry passes natively, passes through the CPU fallback, or fails for a
documented reason (EXPECTED_FAIL / EXPECTED_FAIL_BY_DTYPE / EXPECTED_REFERENCE_FAIL /
EXPECTED_ERROR_FAIL / EXPECTED_GRAD_FAIL in opinfo_parity.py, shown as xfail).
The last tests guard the native pass counts once a whole sweep has run.

CI runs 2 sample inputs and 3 extremal reference inputs per entry;
TORCH_TPU_OPINFO_FULL=1 runs every sample and every reference input instead
(TORCH_TPU_OPINFO_SAMPLES=K sets the sample count)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

import opinfo_parity as oi  # noqa: E402

FULL = os.environ.get("TORCH_TPU_OPINFO_FULL", "") not in ("", "0")
SAMPLES = 1000 if FULL else int(os.environ.get("TORCH_TPU_OPINFO_SAMPLES", "2"))
REF_SAMPLES = 0 if FULL else 3  # 0: every reference input

VALUE_DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.uint8, torch.int8, torch.int16,
                torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128]
REFERENCE_DTYPES = [torch.float32, torch.bfloat16]

# Native passes measured when these guards were set; raise them as ops are added.
# bfloat16: conv_transpose2d/3d sit at the bf16 tolerance (documented as _BF16_SUMS) and
# pass in some runs, so the guard counts them as failing.
NATIVE_PASS_BASELINE = {
    ("values", torch.float32): 580, ("values", torch.bfloat16): 488, ("values", torch.int64): 434,
    ("values", torch.bool): 319, ("values", torch.uint8): 419, ("values", torch.int8): 419,
    ("values", torch.int16): 421, ("values", torch.uint16): 26, ("values", torch.uint32): 26,
    ("values", torch.uint64): 25, ("values", torch.complex64): 317, ("values", torch.complex128): 317,
    ("reference", torch.float32): 408, ("reference", torch.bfloat16): 357,
}
GRAD_PASS_BASELINE = 478  # float32 entries whose input gradients match with no CPU fallback
ERROR_PARITY_TARGET = 0.95  # share of error inputs (that CPU rejects as described) tpu rejects the same way

RESULTS = {}  # (sweep, dtype) -> {entry: result}; error sweep: ("errors", None) -> {entry: [rows]}
ENTRIES = oi.op_entries()


def _params(dtypes):
    return [pytest.param(name, dt, id=f"{str(dt)[6:]}-{name}")
            for dt in dtypes for name, op in ENTRIES if dt in op.supported_dtypes("cpu")]


def _op(name):
    return dict(ENTRIES)[name]


def _check(result, dtype, inputs):
    name, res, why = result[:3]
    if res == "fail":
        expected = oi.expected_fail(name, dtype, inputs)
        if expected:
            pytest.xfail(f"{expected} ({why})")
        pytest.fail(f"{name} [{dtype}, {inputs} inputs]: {why}")
    if res == "skip":
        pytest.skip(why)


def _run_values(name, dtype):
    op = _op(name)
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        r = oi.run_entry(op, SAMPLES, dtype)
        if dtype == torch.float32:
            g = ("skip", r[2]) if r[1] in ("skip", "fail") or op.name in oi.REASONS else oi.run_grads(op, SAMPLES)
            r = r + g
    RESULTS.setdefault(("values", dtype), {})[name] = r
    if len(r) > 3 and r[3] == "fail" and name not in oi.EXPECTED_GRAD_FAIL and r[1] != "fail":
        pytest.fail(f"{name}: input gradients differ: {r[4]}")
    _check(r, dtype, "sample")


def _run_reference(name, dtype):
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        r = oi.run_entry(_op(name), REF_SAMPLES, dtype, "reference")
    RESULTS.setdefault(("reference", dtype), {})[name] = r
    _check(r, dtype, "reference")


def _complete(key, expected_names):
    got = RESULTS.get(key, {})
    if set(got) != set(expected_names):
        pytest.skip(f"only {len(got)} of {len(expected_names)} entries of this sweep ran in this session")
    return got


def _check_counts(sweep, dtype):
    names = [p.values[0] for p in _params([dtype])]
    got = _complete((sweep, dtype), names)
    results = list(got.values())
    counts, tested = oi.summary(results)
    assert counts["pass"] >= NATIVE_PASS_BASELINE[(sweep, dtype)], counts
    if (sweep, dtype) == ("values", torch.float32):
        assert counts["pass"] >= 0.9 * tested, counts  # issue 3's target: 90% of tested entries natively
        assert tested >= 600, counts
        assert oi.grad_summary(results)["pass"] >= GRAD_PASS_BASELINE


# One class per sweep and dtype: its entries, then the guard over their results.
# (scripts/test.sh runs pytest-xdist with --dist loadscope, which keeps a class in one
# worker, so the guard sees every result of its sweep.)
def _sweep_class(sweep, dtype):
    run = _run_values if sweep == "values" else _run_reference

    class Sweep:
        @pytest.mark.parametrize("name,dtype", _params([dtype]))
        def test_entry(self, name, dtype):
            run(name, dtype)

        def test_native_pass_count(self):
            _check_counts(sweep, dtype)

    Sweep.__name__ = Sweep.__qualname__ = f"Test{sweep.capitalize()}_{str(dtype)[6:]}"
    return Sweep


for _sweep, _dtypes in (("values", VALUE_DTYPES), ("reference", REFERENCE_DTYPES)):
    for _dt in _dtypes:
        _cls = _sweep_class(_sweep, _dt)
        globals()[_cls.__name__] = _cls


class TestErrors:
    @pytest.mark.parametrize("name", [name for name, op in ENTRIES if op.error_inputs_func is not None])
    def test_errors(self, name):
        rows = oi.run_errors(_op(name))
        RESULTS.setdefault(("errors", None), {})[name] = rows
        bad = [(rx, why) for _, rx, res, why in rows if res == "fail" and not oi.expected_error_fail(name, rx)]
        assert not bad, f"{name}: {len(bad)} error inputs differ from CPU: {bad[:5]}"
        if rows and all(r[2] != "pass" for r in rows):
            if all(r[2] == "skip" for r in rows):
                pytest.skip(rows[0][3])
            pytest.xfail("; ".join(sorted({oi.expected_error_fail(name, r[1]) for r in rows if r[2] == "fail"})))

    def test_error_input_parity(self):
        names = [name for name, op in ENTRIES if op.error_inputs_func is not None]
        got = _complete(("errors", None), names)
        rows = [r for rs in got.values() for r in rs]
        counts = oi.error_summary(rows)
        tested = counts["pass"] + counts["fail"]
        assert tested >= 650, counts
        assert counts["pass"] >= ERROR_PARITY_TARGET * tested, counts
