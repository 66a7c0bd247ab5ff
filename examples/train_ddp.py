"""Data-parallel training (DDP) of examples/train_gpt.py's GPT, launched as GPU users do:

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py

Written as an NCCL script is, with `init_process_group("nccl")` replaced by
`init_process_group()` and "cuda" by "tpu" (`--device cpu` runs the same script on CPU
tensors over gloo). Each step every rank draws the same global batch and trains on its
share; DDP averages the gradients. `--check` then repeats the steps in this process on
the full batch without DDP and asserts that the parameters match.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt import GPT, CharData, make_corpus  # noqa: E402


def build(args, vocab, device):
    torch.manual_seed(args.seed)  # same initial parameters on every rank and in the reference
    return GPT(vocab, d=args.dmodel, layers=args.layers, block=args.block, dropout=args.dropout).to(device)


def make_opt(args, params):
    if args.opt == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="tpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="global batch (split over the ranks)")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--dmodel", type=int, default=64)  # not --d: torchrun would take it
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--opt", choices=["adamw", "sgd"], default="adamw",
                    help="sgd (momentum 0.9) for --check: Adam turns the rounding noise of zero "
                         "gradients (the attention's key bias) into lr-sized steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="compare with one process on the full batch")
    ap.add_argument("--precision", default=None, help="torch.set_float32_matmul_precision value")
    args = ap.parse_args()
    if args.precision:
        torch.set_float32_matmul_precision(args.precision)

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "tpu":
        torch.tpu.set_device(local_rank)
        device = torch.device("tpu", local_rank)
    else:
        device = torch.device(args.device)
    dist.init_process_group()  # tpu: "cpu:gloo,tpu:tpu_dist"
    rank, world = dist.get_rank(), dist.get_world_size()
    assert args.batch % world == 0, "the global batch must split evenly over the ranks"

    data = CharData(make_corpus(), args.block, "cpu")
    model = DDP(build(args, data.vocab, device), device_ids=[local_rank] if device.type == "tpu" else None)
    opt = make_opt(args, model.parameters())
    gen = torch.Generator().manual_seed(args.seed)
    batches, times, losses = [], [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = data.batch(args.batch, gen)  # the same global batch on every rank
        batches.append((x, y))
        xs, ys = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        _, loss = model(xs, ys)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # the full batch's loss
        losses.append(mean.item())
        times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {step:3d}  loss {losses[-1]:.6f}  {times[-1] * 1000:.1f} ms", flush=True)
    steady = times[len(times) // 2:]
    if rank == 0:
        print(f"ranks {world}  steady step {sum(steady) / len(steady) * 1000:.1f} ms  final loss {losses[-1]:.6f}")

    if args.check:
        ref = build(args, data.vocab, device)
        ref_opt = make_opt(args, ref.parameters())
        ref_losses = []
        for x, y in batches:
            _, loss = ref(x.to(device), y.to(device))
            ref_opt.zero_grad(set_to_none=True)
            loss.backward()
            ref_opt.step()
            ref_losses.append(loss.item())
        worst = max((a - b).abs().max().item() for a, b in zip(model.module.parameters(), ref.parameters()))
        loss_gap = max(abs(a - b) for a, b in zip(losses, ref_losses))
        print(f"rank {rank}: max parameter difference vs one process {worst:.3g}, max loss difference {loss_gap:.3g}")
        assert worst < 2e-4 and loss_gap < 1e-4, (worst, loss_gap)
        print(f"rank {rank}: CHECK OK")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
