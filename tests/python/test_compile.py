"""Compiled mode: torch.compile on tpu tensors (backend "tpu", also the default).

Each FX graph becomes one program (forward, backward, inference, an optimizer
step); parity with eager tpu and with CPU, recompiles only on new shapes,
mutation of inputs, dropout from the device generator, graph breaks, eager
nodes for unlowered ops, precision modes and autocast inside compiled code, and
CPU torch.compile still on Inductor."""
import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu import _compile

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def counters():
    r = torch_tpu.metrics.report()
    return {k: r[k] for k in ("compiles", "captures", "compiled_runs", "executions", "compiled_eager_nodes")}


def gpt(dropout=0.0, **kw):
    sys.path.insert(0, EXAMPLES)
    from train_gpt import GPT

    return GPT(40, d=32, layers=2, heads=4, block=16, dropout=dropout, **kw)


def train(model, steps, compiled, device, data, lr=1e-2):
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    fwd = torch.compile(model) if compiled else model
    step = torch.compile(opt.step) if compiled else opt.step
    losses = []
    for x, y in data[:steps]:
        _, loss = fwd(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        step()
        losses.append(loss.item())
    return losses, model


def gpt_data(n=4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 40, (4, 16), generator=g), torch.randint(0, 40, (4, 16), generator=g)) for _ in range(n)]


def test_gpt_training_matches_eager_one_program_per_graph(highest):
    torch.manual_seed(0)
    base = gpt()
    data = gpt_data()
    eager, m_e = train(copy.deepcopy(base), 4, False, "tpu", data)
    torch_tpu.metrics.reset()
    compiled, m_c = train(copy.deepcopy(base), 4, True, "tpu", data)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    for p, q in zip(m_c.parameters(), m_e.parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu(), rtol=1e-3, atol=1e-3)  # AdamW amplifies tiny gradients
    c = counters()
    # forward, backward and the optimizer step: three graphs, each run once per step as one program
    assert c["captures"] == 3 and c["compiled_runs"] == 12, c
    assert torch_tpu.metrics.cpu_fallbacks() == {}


def test_gpt_training_matches_cpu(highest):
    torch.manual_seed(0)
    base = gpt()
    data = gpt_data(3)
    cpu, _ = train(copy.deepcopy(base), 3, False, "cpu", data)
    tpu, _ = train(copy.deepcopy(base), 3, True, "tpu", data)
    torch.testing.assert_close(tpu, cpu, rtol=1e-4, atol=1e-4)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 3, stride=2)
        self.fc = nn.Linear(4 * 2 * 2, 5)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        return self.fc(self.c2(x).flatten(1))


def test_cnn_batchnorm_training_updates_running_stats(highest):
    torch.manual_seed(0)
    m_cpu = CNN()
    m_tpu = copy.deepcopy(m_cpu).to("tpu")
    cm = torch.compile(m_tpu)
    oc, ot = torch.optim.SGD(m_cpu.parameters(), lr=0.1), torch.optim.SGD(m_tpu.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))
        lc = F.cross_entropy(m_cpu(x), y)
        lc.backward(), oc.step(), oc.zero_grad()
        lt = F.cross_entropy(cm(x.to("tpu")), y.to("tpu"))
        lt.backward(), ot.step(), ot.zero_grad()
        torch.testing.assert_close(lt.item(), lc.item(), rtol=1e-4, atol=1e-4)
    # the running statistics are inputs the compiled forward writes
    torch.testing.assert_close(m_tpu.bn.running_mean.cpu(), m_cpu.bn.running_mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m_tpu.bn.running_var.cpu(), m_cpu.bn.running_var, rtol=1e-4, atol=1e-5)
    assert m_tpu.bn.num_batches_tracked.item() == 3
    m_cpu.eval(), m_tpu.eval()
    x = torch.randn(4, 3, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(cm(x.to("tpu")).cpu(), m_cpu(x), rtol=1e-4, atol=1e-4)


@torch._dynamo.config.patch(allow_rnn=True)  # Dynamo runs nn.LSTM eagerly (on every device) unless asked
def test_lstm_forward_backward(highest):
    torch.manual_seed(0)
    ref = nn.LSTM(5, 7, num_layers=2, batch_first=True)
    m = copy.deepcopy(ref).to("tpu")
    x = torch.randn(3, 6, 5)
    out_ref, _ = ref(x)
    torch_tpu.metrics.reset()
    out, _ = torch.compile(m)(x.to("tpu"))
    out_ref.pow(2).sum().backward()
    out.pow(2).sum().backward()
    torch.testing.assert_close(out.cpu(), out_ref, rtol=1e-4, atol=1e-5)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-3, atol=1e-4)
    c = counters()
    assert c["captures"] == 2 and c["compiled_eager_nodes"] == 0, c  # a forward and a backward program


def test_inference_parity_and_shapes_recompile_only_when_new(highest):
    torch.manual_seed(0)
    m = gpt().eval()
    mt = copy.deepcopy(m).to("tpu")
    cm = torch.compile(mt, dynamic=False)
    x = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(cm(x.to("tpu"))[0].cpu(), m(x)[0], rtol=1e-4, atol=1e-4)
        torch_tpu.metrics.reset()
        for _ in range(3):
            cm(x.to("tpu"))
        assert counters()["captures"] == 0 and counters()["compiled_runs"] == 3
        x2 = torch.randint(0, 40, (3, 8))  # a new shape: a new program
        torch.testing.assert_close(cm(x2.to("tpu"))[0].cpu(), m(x2)[0], rtol=1e-4, atol=1e-4)
        assert counters()["captures"] == 1
        cm(x2.to("tpu"))
        assert counters()["captures"] == 1


def test_dynamic_shapes_compile_one_program_per_bucket():
    """dynamic=True: a symbolic dim is bucketed (torch_tpu.dynamic), so sizes of one bucket share a
    compiled program (each new size is a capture, not a compile)."""
    f = torch.compile(lambda x: x * 2 + 1, dynamic=True)
    counts = []
    for n in (3, 4, 5, 6, 7):  # buckets 4 and 8
        c0 = counters()["compiles"]
        torch.testing.assert_close(f(torch.ones(n, device="tpu")).cpu(), torch.full((n,), 3.0))
        counts.append(counters()["compiles"] - c0)
    assert sum(counts[2:]) <= 2 and counts[3] == 0 and counts[4] == 0, counts


def test_mutation_of_inputs():
    def h(buf, x):
        buf.copy_(x * 2)
        buf[0] = 7
        return buf.sum()

    b = torch.zeros(3, device="tpu")
    r = torch.compile(h)(b, torch.arange(3.0, device="tpu"))
    assert b.cpu().tolist() == [7.0, 2.0, 4.0]
    assert r.item() == 13.0
    # a view as input: written through to its base
    base = torch.zeros(2, 3, device="tpu")
    torch.compile(h)(base[1], torch.ones(3, device="tpu"))
    assert base.cpu().tolist() == [[0, 0, 0], [7, 2, 2]]


def test_dropout_reproducible_without_recompiles():
    d = torch.compile(nn.Dropout(0.5).to("tpu"))
    x = torch.ones(16, 16, device="tpu")
    torch.manual_seed(3)
    a1, a2 = d(x).cpu(), d(x).cpu()
    torch.manual_seed(3)
    b1 = d(x).cpu()
    assert torch.equal(a1, b1) and not torch.equal(a1, a2)
    assert 0.3 < (a1 != 0).float().mean().item() < 0.7 and set(a1.unique().tolist()) <= {0.0, 2.0}
    torch_tpu.metrics.reset()
    for _ in range(4):
        d(x)
    c = counters()
    assert c["compiles"] == 0 and c["captures"] == 0 and c["compiled_runs"] == 4 and c["executions"] == 4


def test_graph_break_in_the_middle(capsys):
    def f(x):
        y = x.sin() * 2
        print("inside")
        s = y.sum().item()
        return y + s

    x = torch.randn(5)
    torch.testing.assert_close(torch.compile(f)(x.to("tpu")).cpu(), f(x), rtol=1e-5, atol=1e-5)
    assert "inside" in capsys.readouterr().out


def test_unlowered_op_runs_eagerly_inside(highest):
    def g(x):
        a = x @ x.T + 1
        return torch.linalg.svdvals(a).sum() + a.mean()

    x = torch.randn(4, 4)
    torch_tpu.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = torch.compile(g)(x.to("tpu"))
    torch.testing.assert_close(r.cpu(), g(x), rtol=1e-4, atol=1e-4)
    assert torch_tpu.metrics.report()["compiled_eager_nodes"] == 1


def test_compiled_optimizer_step_matches_eager():
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(7)]
    grads = [torch.randn_like(p) for p in params]
    runs = []
    for compiled in (False, True):
        ps = [nn.Parameter(p.clone().to("tpu")) for p in params]
        opt = torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1)
        step = torch.compile(opt.step) if compiled else opt.step
        for _ in range(3):
            for p, g in zip(ps, grads):
                p.grad = g.to("tpu")
            step()
        runs.append([p.detach().cpu() for p in ps])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_precision_modes_apply_inside_compiled_programs():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ref = a.double() @ b.double()
    f = torch.compile(lambda x, y: x @ y)
    at, bt = a.to("tpu"), b.to("tpu")
    err = {}
    for p in (torch.tpu.Precision.DEFAULT, torch.tpu.Precision.HIGHEST):
        with torch.tpu.precision(p):
            err[p] = (f(at, bt).cpu().double() - ref).abs().max().item()
    assert err[torch.tpu.Precision.HIGHEST] < 1e-4 < err[torch.tpu.Precision.DEFAULT]


def test_autocast_inside_compiled_region():
    def f(a, b):
        with torch.autocast("tpu"):
            return a @ b, (a + b).sum()

    a, b = torch.randn(8, 8, device="tpu"), torch.randn(8, 8, device="tpu")
    mm, s = torch.compile(f)(a, b)
    assert mm.dtype == torch.bfloat16 and s.dtype == torch.float32
    torch.testing.assert_close(mm.float().cpu(), a.cpu() @ b.cpu(), rtol=2e-2, atol=5e-2)


def test_cpu_compile_still_uses_inductor():
    from torch._dynamo.utils import counters as dyn

    dyn.clear()
    before = torch_tpu.metrics.report()["compiled_graphs"]
    x = torch.randn(10)
    f = torch.compile(lambda t: (t.cos() + 1).sum())
    torch.testing.assert_close(f(x), (x.cos() + 1).sum())
    assert sum(dyn["inductor"].values()) > 0  # Inductor compiled it
    assert torch_tpu.metrics.report()["compiled_graphs"] == before  # not the tpu backend
    assert torch.compiler.get_default_backend() == "tpu"


def test_plain_torch_compile_goes_to_tpu_backend():
    before = torch_tpu.metrics.report()["compiled_graphs"]
    f = torch.compile(lambda t: t.exp().sum())
    x = torch.randn(6)
    torch.testing.assert_close(f(x.to("tpu")).cpu(), x.exp().sum())
    assert torch_tpu.metrics.report()["compiled_graphs"] == before + 1


def test_warm_restart_compiles_nothing(tmp_path):
    script = (
        "import torch, torch_tpu, sys\n"
        f"sys.path.insert(0, {EXAMPLES!r})\n"
        "from train_gpt import GPT\n"
        "torch.manual_seed(0)\n"
        "m = GPT(40, d=32, layers=1, block=16).to('tpu')\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "f = torch.compile(m)\n"
        "x = torch.randint(0, 40, (2, 16), device='tpu')\n"
        "_, loss = f(x, x); loss.backward(); opt.step()\n"
        "print(loss.item(), torch_tpu.metrics.report()['compiles'])\n"
    )
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    (l1, c1), (l2, c2) = [r.stdout.split()[-2:] for r in runs]
    assert l1 == l2 and int(c1) > 0 and int(c2) == 0


def _zoo():
    sys.path.insert(0, os.path.dirname(__file__))
    from test_models import MODELS

    return MODELS


@pytest.mark.parametrize("name", list(_zoo()))
@torch._dynamo.config.patch(allow_rnn=True)
def test_model_zoo_compiled_matches_cpu(name):
    """test_models.py's models, compiled: forward and backward match CPU, no eager node, no fallback."""
    make, inp, loss_fn = _zoo()[name]
    torch.manual_seed(0)
    cpu = make()
    tpu = copy.deepcopy(cpu).to("tpu")
    x = inp()
    torch_tpu.metrics.reset()
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        lc = loss_fn(cpu(x))
        lt = loss_fn(torch.compile(tpu)(x.to("tpu")))
        lc.backward()
        lt.backward()
    m = torch_tpu.metrics.report()
    assert m["cpu_fallbacks"] == {} and m["compiled_eager_nodes"] == 0 and m["compiled_eager_graphs"] == 0
    assert m["captures"] >= 2  # a forward and a backward program
    torch.testing.assert_close(lt.cpu(), lc, rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-4, msg=lambda msg: f"{name}.{n}: {msg}")


def test_cpu_tensors_in_and_out_of_a_compiled_graph():
    f = torch.compile(lambda x, y: x.to("tpu") * 2 + y)
    y = torch.ones(4, device="tpu")
    for k in range(2):  # the CPU input is uploaded on every call
        x = torch.arange(4.0) + k
        torch.testing.assert_close(f(x, y).cpu(), x * 2 + 1)
    g = torch.compile(lambda t: (t * 2).cpu() + 1)
    out = g(torch.arange(3.0, device="tpu"))
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, torch.tensor([1.0, 3.0, 5.0]))
