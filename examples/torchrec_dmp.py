"""TorchRec's DistributedModelParallel on tpu: an EmbeddingBagCollection whose tables are sharded
table-wise and row-wise over the ranks of a `tpu_dist` process group, trained with SGD, as
TorchRec's docs write it for GPUs with the device changed.

    torchrun --nproc_per_node=2 examples/torchrec_dmp.py [--steps 5] [--out result.pt]

Each rank trains on its share of every global batch; rank 0 prints the global loss per step and,
with --out, saves the losses and the full tables (gathered from the shards) for comparison with
an unsharded run (tests/train/test_torchrec.py).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ShardingType

TABLES = [("t_user", 64, 16, ShardingType.TABLE_WISE), ("t_item", 48, 16, ShardingType.ROW_WISE),
          ("t_tags", 32, 32, ShardingType.TABLE_WISE)]  # UNFUSED_TPU needs dims that are multiples of 16
FEATURES = ["user", "item", "tags"]
GLOBAL_BATCH, LR = 8, 0.5


def table_configs():
    return [EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[feature])
            for (name, rows, dim, _), feature in zip(TABLES, FEATURES)]


def initial_tables():
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(rows, dim, generator=g) * 0.1 for name, rows, dim, _ in TABLES}


def global_batch(step):
    """(lengths per feature x sample, ids, targets) of one global batch, the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(0, 4, (len(FEATURES), GLOBAL_BATCH), generator=g)
    ids = [torch.randint(0, rows, (int(lengths[f].sum()),), generator=g) for f, (_, rows, _, _) in enumerate(TABLES)]
    targets = torch.randn(GLOBAL_BATCH, sum(dim for _, _, dim, _ in TABLES), generator=g)
    return lengths, ids, targets


def kjt_for(lengths, ids, samples, device):
    """The KJT of the given samples of a global batch."""
    values, lens = [], []
    for f in range(len(FEATURES)):
        starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths[f].cumsum(0)])
        values += [ids[f][starts[s]:starts[s + 1]] for s in samples]
        lens.append(lengths[f][samples])
    return KeyedJaggedTensor(keys=FEATURES, values=torch.cat(values).to(device),
                             lengths=torch.cat(lens).to(device).int())


def pooled_in_feature_order(keyed):
    """The KeyedTensor's features in FEATURES order (a sharded collection orders its output keys
    by sharding)."""
    per_key = keyed.to_dict()
    return torch.cat([per_key[f] for f in FEATURES], dim=1)


def loss_fn(pooled, targets):
    """The mean over the samples given. Like DDP, TorchRec divides the tables' gradients by the
    world size (gradient division), so the ranks' local means train as the global batch's mean."""
    return ((pooled - targets) ** 2).sum(dim=1).mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    dist.init_process_group(backend="tpu_dist")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpu", int(os.environ.get("LOCAL_RANK", 0)))
    torch.tpu.set_device(device)

    ebc = EmbeddingBagCollection(tables=table_configs(), device=torch.device("meta"))
    # UNFUSED_TPU: TorchRec's kernel for device "tpu" (lookups as torchrec:: ops, the optimizer
    # outside); the planner would otherwise pick FUSED, fbgemm's CPU/CUDA-only table-batched kernel
    constraints = {name: ParameterConstraints(sharding_types=[kind.value],
                                              compute_kernels=[EmbeddingComputeKernel.UNFUSED_TPU.value])
                   for name, _, _, kind in TABLES}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="tpu"),
                                       constraints=constraints)
    plan = planner.collective_plan(ebc, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)
    model = DistributedModelParallel(ebc, device=device, plan=plan, sharders=[EmbeddingBagCollectionSharder()])
    if rank == 0:
        print(plan)

    # the same initial tables as the unsharded reference: each rank copies its shards' rows
    init = initial_tables()
    with torch.no_grad():
        for key, sharded in model.state_dict().items():
            name = key.split(".")[-2]
            for shard in sharded.local_shards():
                r, c = shard.metadata.shard_offsets
                h, w = shard.metadata.shard_sizes
                shard.tensor.copy_(init[name][r:r + h, c:c + w])

    # TorchRec 1.9.2's DistributedModelParallel lists only empty placeholders for UNFUSED_TPU tables
    # in model.parameters(); the local shards of its state_dict are the tables' parameters
    shards = [shard.tensor for sharded in model.state_dict().values() for shard in sharded.local_shards()]
    assert all(isinstance(t, torch.nn.Parameter) and t.device == device for t in shards)
    optimizer = torch.optim.SGD(shards, lr=LR)
    per_rank = GLOBAL_BATCH // world
    losses = []
    for step in range(args.steps):
        lengths, ids, targets = global_batch(step)
        samples = list(range(rank * per_rank, (rank + 1) * per_rank))
        pooled = pooled_in_feature_order(model(kjt_for(lengths, ids, samples, device)))
        loss = loss_fn(pooled, targets[samples].to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)

    tables = {}
    for key, sharded in model.state_dict().items():
        name = key.split(".")[-2]
        full = torch.zeros(init[name].shape, device=device) if rank == 0 else None
        sharded.gather(dst=0, out=full)
        tables[name] = full.cpu() if rank == 0 else None
    if rank == 0:
        import torch_tpu

        fallbacks = torch_tpu.metrics.cpu_fallbacks()
        print("ops on the CPU fallback:", fallbacks)
        if args.out:
            torch.save({"losses": losses, "tables": tables, "plan": str(plan), "fallbacks": fallbacks}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
