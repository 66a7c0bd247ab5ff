"""The trace cache (repeated-sequence detection): a graph whose ops match a
recorded sequence is built without program text and runs the recorded
executable. These tests check that a replay computes what building the text
would (bitwise), that everything which shapes the text (structural numbers,
the precision mode, which storages an op touches) ends a replay, and, in
verify mode, that the replayed text is the text the ops produce."""
import pytest
import torch

import torch_tpu
from test_fuzz_modes import make_program, run_program

E = torch_tpu.EagerMode


@pytest.fixture
def verify():
    torch_tpu._C._set_tracing(True, True)
    yield
    torch_tpu._C._set_tracing(True, False)


@pytest.fixture
def no_traces():
    torch_tpu._C._set_tracing(False, False)
    yield
    torch_tpu._C._set_tracing(True, False)


def fused_run(ops, seed):
    torch.tpu.manual_seed(seed)
    rand = []
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST), torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        return run_program(ops, "tpu", rand) + rand


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_program_replays_its_recorded_text(seed, verify):
    ops = make_program(seed)
    first = fused_run(ops, seed)
    torch_tpu.metrics.reset()
    second = fused_run(ops, seed)
    m = torch_tpu.metrics.report()
    assert m["trace_hits"] >= 1, m
    assert m["trace_verify_failures"] == 0
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("seed", range(6))
def test_dry_replay_equals_building_the_text(seed):
    ops = make_program(seed)
    fused_run(ops, seed)  # records
    torch_tpu.metrics.reset()
    replayed = fused_run(ops, seed)
    assert torch_tpu.metrics.trace_hits >= 1
    torch_tpu._C._set_tracing(False, False)
    try:
        built = fused_run(ops, seed)
    finally:
        torch_tpu._C._set_tracing(True, False)
    for a, b in zip(replayed, built):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", [E.DEFER_NEVER, E.DEFER_AND_FUSE], ids=["strict", "fuse"])
def test_structural_numbers_end_a_replay(mode, verify):
    # pow's exponent and add's alpha == 1 shape the text; the other numbers are
    # runtime parameters. Changing them between otherwise equal steps must not
    # replay a program built for other values.
    x = torch.randn(5, 7)
    xt = x.to("tpu")
    with torch_tpu.eager_mode(mode):
        for k in [2.0, 2.0, 3.0, 0.5, 1.0, 1.0, 2.0]:
            got = (torch.add(xt.abs().pow(k), xt, alpha=k) * k).cpu()
            want = torch.add(x.abs().pow(k), x, alpha=k) * k
            torch.testing.assert_close(got, want)
    assert torch_tpu.metrics.trace_verify_failures == 0


def test_precision_mode_ends_a_replay():
    a = torch.randn(64, 64)
    b = torch.randn(64, 64)
    ref = (a.double() @ b.double()).float()
    at, bt = a.to("tpu"), b.to("tpu")
    errs = {}
    with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        for p in ["DEFAULT", "DEFAULT", "HIGHEST", "DEFAULT", "HIGHEST"]:
            with torch.tpu.precision(getattr(torch.tpu.Precision, p)):
                errs.setdefault(p, []).append(((at @ bt).cpu() - ref).abs().max().item())
    assert max(errs["HIGHEST"]) < 1e-4 < min(errs["DEFAULT"])


def test_same_storage_twice_is_not_confused_with_two_storages():
    # x + y and x + x share their op signature but not their text
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    xt, yt = x.to("tpu"), y.to("tpu")
    with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        for _ in range(2):
            torch.testing.assert_close((xt + yt).cpu(), x + y)
            torch.testing.assert_close((xt + xt).cpu(), x + x)
            z = xt.clone()
            z.add_(z)
            torch.testing.assert_close(z.cpu(), x + x)


def test_diverging_loop_body_leaves_the_trace():
    x = torch.randn(16)
    xt = x.to("tpu")
    with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        def step(last):
            y = torch.tanh(xt) * 2
            y = torch.sin(y) if last == "sin" else torch.cos(y)
            return (y + 1).cpu()
        step("sin"), step("sin")
        torch_tpu.metrics.reset()
        got = step("cos")
        m = torch_tpu.metrics.report()
    torch.testing.assert_close(got, torch.cos(torch.tanh(x) * 2) + 1)
    assert m["trace_exits"] >= 1 and m["trace_hits"] == 0


def test_strict_mode_ops_run_from_traces():
    x = torch.randn(33, 3, device="tpu")
    with torch_tpu.eager_mode(E.DEFER_NEVER):
        (x * 2 + 1).cpu()
        torch_tpu.metrics.reset()
        for _ in range(3):
            y = (x * 2 + 1).cpu()
        m = torch_tpu.metrics.report()
    torch.testing.assert_close(y, x.cpu() * 2 + 1)
    assert m["executions"] == 6 and m["trace_hits"] == 6 and m["compiles"] == 0


def test_tracing_off_builds_text_every_time(no_traces):
    x = torch.randn(33, 3, device="tpu")
    with torch_tpu.eager_mode(E.DEFER_NEVER):
        (x * 2).cpu()
        torch_tpu.metrics.reset()
        (x * 2).cpu()
    m = torch_tpu.metrics.report()
    assert m["trace_hits"] == 0 and m["cache_hits"] == 1 and m["program_bytes"] > 0



def test_a_first_op_that_raises_leaves_no_trace_behind():
    """Strict: an op that matches a recorded trace and then raises in its rule
    must not leave that trace chosen for the next, different op."""
    t = torch.ones(3, device="tpu")
    with torch_tpu.eager_mode(E.DEFER_NEVER):
        for _ in range(3):  # recorded, then replayed
            torch_tpu._C._test_keyed_op(t, False)
            t.cpu()
        with pytest.raises(RuntimeError, match="failed on purpose"):
            torch_tpu._C._test_keyed_op(t, True)
        x = torch.full((2,), 3.0, device="tpu")
        assert x.cpu().tolist() == [3.0, 3.0]
    assert t.cpu().tolist() == [8.0] * 3


def test_an_op_that_raises_mid_replay_keeps_the_numbering():
    """DeferAndFuse: an op that raises in the middle of a replayed sequence is
    rolled back; the replay goes on and a new op after it builds on its values."""
    x = torch.arange(4.0, device="tpu")
    with torch_tpu.eager_mode(E.DEFER_AND_FUSE):
        for _ in range(3):
            y = x * 2
            torch_tpu._C._test_keyed_op(y, False)
            (y + 1).cpu()
        y = x * 2
        with pytest.raises(RuntimeError, match="failed on purpose"):
            torch_tpu._C._test_keyed_op(y, True)
        torch_tpu._C._test_keyed_op(y, False)
        z = ((y + 1) - 3).cpu()
    assert z.tolist() == [(v * 4 + 1) - 3 for v in range(4)]
