"""Two Python threads issuing tpu work at once: a loader thread moving batches
to the device while the main thread trains, and two threads training their own
models, in Strict, DeferAndFuse and compiled mode. Results equal single-threaded
runs and nothing deadlocks (each run has a timeout)."""
import queue
import threading

import pytest
import torch
import torch.nn as nn

import torch_tpu


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def batches(seed, n=6):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(n)]


def train(model, data, compiled=False):
    model = model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fwd = torch.compile(model) if compiled else model
    losses = []
    for x, y in data:
        x, y = (x.to("tpu"), y.to("tpu")) if x.device.type == "cpu" else (x, y)
        loss = (fwd(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_threads(targets, timeout=240):
    errors = []

    def wrap(f):
        def g():
            try:
                f()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        return g

    ts = [threading.Thread(target=wrap(f), daemon=True) for f in targets]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        assert not t.is_alive(), "deadlock: a thread did not finish"
    if errors:
        raise errors[0]


MODES = [torch_tpu.EagerMode.DEFER_NEVER, torch_tpu.EagerMode.DEFER_AND_FUSE]


@pytest.mark.parametrize("mode", MODES)
def test_loader_thread_feeds_training(mode):
    data = batches(0)
    with torch_tpu.eager_mode(mode):
        expected = train(make_model(1), data)
        q = queue.Queue(maxsize=2)

        def loader():
            for x, y in data:
                q.put((x.to("tpu"), y.to("tpu")))
            q.put(None)

        got = []
        model = make_model(1).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def trainer():  # trains on each batch as it arrives
            while (item := q.get(timeout=120)) is not None:
                x, y = item
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                got.append(loss.item())

        run_threads([loader, trainer])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_two_threads_train_their_own_models(mode):
    with torch_tpu.eager_mode(mode):
        expected = [train(make_model(s), batches(s)) for s in (2, 3)]
        # make_model seeds the global generator: build both models first, then train in threads
        models = [make_model(2), make_model(3)]
        got = [None, None]
        run_threads([lambda: got.__setitem__(0, train(models[0], batches(2))),
                     lambda: got.__setitem__(1, train(models[1], batches(3)))])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def test_two_threads_run_compiled_models():
    models = [make_model(4), make_model(5)]
    expected = [train(make_model(s), batches(s), compiled=True) for s in (4, 5)]
    torch._dynamo.reset()
    got = [None, None]
    run_threads([lambda: got.__setitem__(0, train(models[0], batches(4), compiled=True)),
                 lambda: got.__setitem__(1, train(models[1], batches(5), compiled=True))])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_a_capture_belongs_to_its_thread():
    """While one thread captures a graph for torch.compile, another thread's
    eager ops on the same device run as usual (not into that capture)."""
    x = torch.arange(4.0, device="tpu")
    began, done = threading.Event(), threading.Event()
    got = []

    def capturing():
        torch_tpu._C._capture_begin(0)
        try:
            began.set()
            assert done.wait(120)
            assert torch_tpu._C._capture_broken() is False
        finally:
            torch_tpu._C._capture_abort(0)

    def eager():
        assert began.wait(120)
        try:
            for mode in MODES:
                with torch_tpu.eager_mode(mode):
                    got.append((x * 2 + 1).cpu().tolist())
        finally:
            done.set()

    run_threads([capturing, eager])
    assert got == [[1.0, 3.0, 5.0, 7.0]] * 2
