"""Ray Train on tpu (examples/ray_train_ddp.py): DDP in 2 Ray workers over tpu_dist equals one
process training on the same global batch; metrics and checkpoints come back through
ray.train.report. Runs in .venv-train (scripts/setup_train.sh)."""
import importlib.util
import json
import os
import sys

import pytest
from _jobs import ROOT, run_job
import torch

ray = pytest.importorskip("ray", reason="Ray Train is installed in .venv-train (scripts/setup_train.sh)")

EXAMPLE = os.path.join(ROOT, "examples", "ray_train_ddp.py")
EPOCHS, BATCH, LR = 4, 64, 0.05


def load_example():
    spec = importlib.util.spec_from_file_location("ray_train_ddp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(tmp_path, workers, timeout=240):
    cmd = [sys.executable, EXAMPLE, "--workers", str(workers), "--epochs", str(EPOCHS),
           "--batch-size", str(BATCH), "--lr", str(LR), "--storage", str(tmp_path / "ray")]
    out = run_job(cmd, "the Ray run", timeout, env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    return json.loads(out.strip().splitlines()[-1]), out


def one_process_reference(example):
    """The same model, data, optimizer and global batch, trained in this process on tpu."""
    device = torch.device("tpu")
    model = example.make_model().to(device)
    loader = torch.utils.data.DataLoader(example.make_dataset(), batch_size=BATCH, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for _ in range(EPOCHS):
        total = 0.0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / len(loader))
    return {k: v.cpu() for k, v in model.state_dict().items()}, losses


def test_ddp_in_two_ray_workers_equals_one_process(tmp_path):
    result, out = run_example(tmp_path, workers=2)
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and metrics["device"].startswith("tpu") and metrics["epoch"] == EPOCHS - 1
    assert "Moving model to device: tpu" in out and "Wrapping provided model in DistributedDataParallel" in out
    # metrics through ray.train.report: one row per epoch, the loss falls
    losses = result["losses"]
    assert len(losses) == EPOCHS and losses[-1] < 0.6 * losses[0], losses
    # the checkpoint through ray.train.report holds the trained weights
    state = torch.load(os.path.join(result["checkpoint"], "model.pt"))
    ref_state, ref_losses = one_process_reference(load_example())
    assert state.keys() == ref_state.keys()
    for k in state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-4, atol=1e-5, msg=k)
    # the 2 workers' all-reduced mean loss per epoch equals the one process's mean over the same batches
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    # DDP on tpu records its iteration times (no "Time stats ... only for CPU and CUDA" warning)
    assert "only collected for CPU and CUDA" not in out
