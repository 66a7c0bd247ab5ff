"""TorchRec on tpu, unsharded: EmbeddingBagCollection and EmbeddingCollection forward and backward
against CPU with no CPU fallback (nn.EmbeddingBag / nn.Embedding natively, fbgemm's jagged ops
through torch_tpu/_fbgemm.py), KeyedJaggedTensor ops on tpu, and a small DLRM trained on tpu with
CPU's losses. Runs in .venv-train (scripts/setup_train.sh)."""
import importlib.util
import os
import sys

import pytest
import torch
from _jobs import ROOT, run_job

torchrec = pytest.importorskip("torchrec", reason="TorchRec is installed in .venv-train (scripts/setup_train.sh)")
from torchrec import (EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection,  # noqa: E402
                      EmbeddingConfig, KeyedJaggedTensor, KeyedTensor, PoolingType)

from torch_tpu import metrics  # noqa: E402

TPU = torch.device("tpu")
FEATURES = ["user", "item", "tags"]


def make_kjt(device, batch=6, seed=0, max_len=4, weighted=False, keys=FEATURES, rows=40):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (len(keys) * batch,), generator=g, dtype=torch.int32)
    values = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
    weights = torch.rand(int(lengths.sum()), generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=values.to(device), lengths=lengths.to(device),
        weights=weights.to(device) if weighted else None)


def pair(module_cls, tables, **kwargs):
    """The same module on CPU and on tpu (state copied)."""
    torch.manual_seed(0)
    cpu = module_cls(tables=tables, device=torch.device("cpu"), **kwargs)
    tpu = module_cls(tables=tables, device=torch.device("cpu"), **kwargs)
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to(TPU)


def bag_tables():
    return [EmbeddingBagConfig(name="t_user", embedding_dim=8, num_embeddings=40, feature_names=["user"]),
            EmbeddingBagConfig(name="t_item", embedding_dim=8, num_embeddings=40, feature_names=["item"],
                               pooling=PoolingType.MEAN),
            EmbeddingBagConfig(name="t_tags", embedding_dim=4, num_embeddings=40, feature_names=["tags"])]


@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_collection_matches_cpu(weighted):
    tables = bag_tables() if not weighted else [
        EmbeddingBagConfig(name=f"t_{f}", embedding_dim=8, num_embeddings=40, feature_names=[f]) for f in FEATURES]
    cpu, tpu = pair(EmbeddingBagCollection, tables, is_weighted=weighted)
    metrics.reset()
    ref = cpu(make_kjt("cpu", weighted=weighted))
    out = tpu(make_kjt(TPU, weighted=weighted))
    assert out.keys() == ref.keys() and out.length_per_key() == ref.length_per_key()
    torch.testing.assert_close(out.values().cpu(), ref.values(), rtol=1e-5, atol=1e-6)
    grad = torch.randn(ref.values().shape)
    ref.values().backward(grad)
    out.values().backward(grad.to(TPU))
    for (name, p_cpu), (_, p_tpu) in zip(cpu.named_parameters(), tpu.named_parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert metrics.cpu_fallbacks() == {}


def test_embedding_collection_matches_cpu():
    tables = [EmbeddingConfig(name="t_user", embedding_dim=8, num_embeddings=40, feature_names=["user", "item"]),
              EmbeddingConfig(name="t_tags", embedding_dim=8, num_embeddings=40, feature_names=["tags"])]
    cpu, tpu = pair(EmbeddingCollection, tables)
    metrics.reset()
    ref = cpu(make_kjt("cpu", seed=3))
    out = tpu(make_kjt(TPU, seed=3))
    assert sorted(out) == sorted(ref)
    loss_cpu = sum((ref[k].values() * (i + 1)).sum() for i, k in enumerate(sorted(ref)))
    loss_tpu = sum((out[k].values() * (i + 1)).sum() for i, k in enumerate(sorted(out)))
    for k in ref:
        torch.testing.assert_close(out[k].values().cpu(), ref[k].values())
        assert torch.equal(out[k].lengths().cpu(), ref[k].lengths())
    loss_cpu.backward()
    loss_tpu.backward()
    for (name, p_cpu), (_, p_tpu) in zip(cpu.named_parameters(), tpu.named_parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, msg=name)
    assert metrics.cpu_fallbacks() == {}


def assert_kjt_equal(a, b):
    assert a.keys() == b.keys()
    assert torch.equal(a.values().cpu(), b.values().cpu())
    assert torch.equal(a.lengths().cpu(), b.lengths().cpu())
    assert torch.equal(a.offsets().cpu(), b.offsets().cpu())
    if b.weights_or_none() is not None:
        assert torch.equal(a.weights().cpu(), b.weights().cpu())


@pytest.mark.parametrize("weighted", [False, True])
def test_keyed_jagged_tensor_ops_stay_on_tpu(weighted):
    metrics.reset()
    cpu, tpu = make_kjt("cpu", seed=5, weighted=weighted), make_kjt(TPU, seed=5, weighted=weighted)
    for order in ([2, 0, 1], [1, 1, 0], [2]):  # a permutation, a repeat, a subset
        out = tpu.permute(order)
        assert out.values().device.type == "tpu"
        assert_kjt_equal(out, cpu.permute(order))
    for a, b in zip(tpu.split([1, 2]), cpu.split([1, 2])):
        assert_kjt_equal(a, b)
    for key, jt in tpu.to_dict().items():
        assert torch.equal(jt.values().cpu(), cpu[key].values())
        assert torch.equal(jt.offsets().cpu(), cpu[key].offsets())
    assert_kjt_equal(KeyedJaggedTensor.concat(tpu.split([2, 1])[::-1]),
                     KeyedJaggedTensor.concat(cpu.split([2, 1])[::-1]))
    assert metrics.cpu_fallbacks() == {}


@pytest.mark.parametrize("sequence,bucketize_pos,keep_orig_idx", [(False, False, False), (True, True, False),
                                                                   (True, False, True)])
def test_block_bucketize_matches_cpu(sequence, bucketize_pos, keep_orig_idx):
    """fbgemm::block_bucketize_sparse_features (row-wise sharding's input distribution), ids past
    the blocks included, against fbgemm's CPU kernel."""
    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(0, 4, (3 * 5,), generator=g, dtype=torch.int32)
    ids = torch.randint(0, 30, (int(lengths.sum()),), generator=g)
    weights = torch.rand(ids.numel(), generator=g)
    block_sizes = torch.tensor([4, 7, 2])
    args = lambda dev: [x.to(dev) for x in (lengths, ids)] + [bucketize_pos, sequence, block_sizes.to(dev), 3,  # noqa: E731
                                                             weights.to(dev)]
    metrics.reset()
    out = torch.ops.fbgemm.block_bucketize_sparse_features(*args(TPU), keep_orig_idx=keep_orig_idx)
    ref = torch.ops.fbgemm.block_bucketize_sparse_features(*args("cpu"), keep_orig_idx=keep_orig_idx)
    for o, r in zip(out, ref):
        assert (o is None) == (r is None)
        if r is not None:
            assert o.dtype == r.dtype and torch.equal(o.cpu(), r)
    assert metrics.cpu_fallbacks() == {}


def test_keyed_tensor_regroup_matches_cpu_forward_and_backward():
    g = torch.Generator().manual_seed(2)
    values = [torch.randn(4, 3, generator=g), torch.randn(4, 5, generator=g)]

    def regroup(device):
        leaves = [v.to(device).requires_grad_() for v in values]
        kts = [KeyedTensor(keys=["a", "b"], length_per_key=[1, 2], values=leaves[0]),
               KeyedTensor(keys=["c", "d"], length_per_key=[4, 1], values=leaves[1])]
        out = KeyedTensor.regroup(kts, [["d", "a"], ["b", "c"]])
        sum((o * torch.arange(o.numel(), device=device).reshape(o.shape)).sum() for o in out).backward()
        return [o.detach().cpu() for o in out], [leaf.grad.cpu() for leaf in leaves]

    metrics.reset()
    out, grads = regroup(TPU)
    ref, ref_grads = regroup("cpu")
    for o, r in zip(out + grads, ref + ref_grads):
        torch.testing.assert_close(o, r)
    assert metrics.cpu_fallbacks() == {}


def test_dlrm_trains_with_cpu_losses():
    from torchrec.models.dlrm import DLRM

    def build(device):
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=f"t_{f}", embedding_dim=8, num_embeddings=40, feature_names=[f])
            for f in FEATURES], device=torch.device("cpu"))
        model = DLRM(embedding_bag_collection=ebc, dense_in_features=5, dense_arch_layer_sizes=[16, 8],
                     over_arch_layer_sizes=[16, 1])
        return model.to(device)

    def train(device):
        model = build(device)
        opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(9)
        losses = []
        for step in range(8):
            dense = torch.randn(6, 5, generator=g)
            labels = torch.randint(0, 2, (6,), generator=g).float()
            logits = model(dense.to(device), make_kjt(device, seed=100 + step)).squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}

    metrics.reset()
    # float32 matmuls on tpu take bf16 operands by default (DEFAULT, as on TPUs); CPU parity needs HIGHEST
    with torch.tpu.precision("highest"):
        losses_tpu, state_tpu = train(TPU)
    losses_cpu, state_cpu = train(torch.device("cpu"))
    assert losses_tpu == pytest.approx(losses_cpu, rel=1e-4, abs=1e-5)
    for k in state_cpu:
        torch.testing.assert_close(state_tpu[k], state_cpu[k], rtol=1e-4, atol=1e-5, msg=k)
    assert metrics.cpu_fallbacks() == {}


def test_distributed_model_parallel_on_two_ranks_equals_one_process(tmp_path):
    """examples/torchrec_dmp.py: tables sharded table-wise and row-wise over 2 ranks (tpu_dist,
    TorchRec's UNFUSED_TPU kernel) train like the unsharded collection in one process."""
    script = os.path.join(ROOT, "examples", "torchrec_dmp.py")
    steps, out_file = 4, tmp_path / "dmp.pt"
    run_job([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv_backend", "c10d",
             "--rdzv_endpoint", "localhost:0", script, "--steps", str(steps), "--out", str(out_file)],
            "DistributedModelParallel", timeout=300)
    result = torch.load(out_file)
    for name, kind in (("t_user", "table_wise"), ("t_item", "row_wise"), ("t_tags", "table_wise")):
        assert any(name in line and kind in line for line in result["plan"].splitlines()), result["plan"]
    # the lookups (torchrec::), the KJT permutes and row-wise bucketizing all run on tpu
    assert result["fallbacks"] == {}, result["fallbacks"]

    spec = importlib.util.spec_from_file_location("torchrec_dmp", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ebc = EmbeddingBagCollection(tables=example.table_configs(), device=torch.device("cpu"))
    init = example.initial_tables()
    with torch.no_grad():
        for name, bag in ebc.embedding_bags.items():
            bag.weight.copy_(init[name])
    ebc = ebc.to(TPU)
    optimizer = torch.optim.SGD(ebc.parameters(), lr=example.LR)
    losses = []
    for step in range(steps):
        lengths, ids, targets = example.global_batch(step)
        pooled = example.pooled_in_feature_order(ebc(example.kjt_for(lengths, ids, list(range(example.GLOBAL_BATCH)), TPU)))
        loss = example.loss_fn(pooled, targets.to(TPU))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert result["losses"] == pytest.approx(losses, rel=1e-5)
    for name, bag in ebc.embedding_bags.items():
        torch.testing.assert_close(result["tables"][name], bag.weight.detach().cpu(), rtol=1e-5, atol=1e-6, msg=name)
        assert not torch.equal(result["tables"][name], init[name]), name  # it trained
