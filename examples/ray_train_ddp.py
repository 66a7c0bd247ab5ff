"""Ray Train on tpu: a model trained with DDP in N Ray workers, written as Ray Train's PyTorch
guide writes it, with the device and the c10d backend changed.

    .venv-train/bin/python examples/ray_train_ddp.py --workers 2

Ray picks a worker's device from the Ray resources it holds (`ray.train.torch.get_device()`
is cuda for a GPU worker, tpu for a worker holding Ray `TPU` resources on a Cloud TPU VM, cpu
otherwise). Where Ray sees no TPU (the XLA CPU plugin, NVIDIA GPUs through torch_tpu), the
train function names the device itself: the line marked "tpu" below; the rest is Ray's API.
`TorchConfig(backend="tpu_dist")` makes Ray call `torch_tpu._loader.load()` and open the
process group on torch_tpu's c10d backend. Metrics and checkpoints go through
`ray.train.report`; the last line printed is the result as JSON.
"""
import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import ray
import ray.train
import ray.train.torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def make_dataset(n=512, seed=0):
    """A 4-class problem whose labels a small MLP can learn."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def train_func(config):
    device = torch.device("tpu")  # tpu: where Ray's get_device() would be cpu (see the docstring)
    world_size = ray.train.get_context().get_world_size()

    model = ray.train.torch.prepare_model(make_model(), move_to_device=device)
    loader = DataLoader(make_dataset(), batch_size=config["batch_size"] // world_size, shuffle=False)
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)

    for epoch in range(config["epochs"]):
        total = torch.zeros((), device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach()
        total /= len(loader)
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # the mean over all workers, on tpu_dist
        metrics = {"epoch": epoch, "loss": total.item(), "device": str(device), "world_size": world_size}
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                state = {k: v.cpu() for k, v in model.module.state_dict().items()}
                torch.save(state, os.path.join(d, "model.pt"))
                checkpoint = Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=checkpoint)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="the global batch (split over the workers)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--storage", default=os.path.join(tempfile.gettempdir(), "ray_train_tpu"))
    args = p.parse_args()

    ray.init(num_cpus=max(2, args.workers))
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
        scaling_config=ScalingConfig(num_workers=args.workers),
        torch_config=TorchConfig(backend="tpu_dist"),
        run_config=RunConfig(storage_path=args.storage, name="ray_train_ddp"),
    )
    result = trainer.fit()
    ray.shutdown()
    history = [float(v) for v in result.metrics_dataframe.drop_duplicates("epoch").sort_values("epoch")["loss"]]
    print(json.dumps({"metrics": result.metrics, "losses": history,
                      "checkpoint": result.checkpoint.path if result.checkpoint else None}))


if __name__ == "__main__":
    main()
