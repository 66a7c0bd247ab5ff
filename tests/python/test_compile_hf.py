"""Compiled mode on HuggingFace models the compile tests don't otherwise name: a few
training steps of torch.compile(model) + SGD on tpu match the same steps in eager tpu
(HIGHEST precision: equal up to float32 reassociation), with every node in a program;
and generate() with a compiled forward and a static cache gives CPU's tokens."""
import warnings

import pytest
import torch

import torch_tpu

tf = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def setup():
    torch._dynamo.reset()
    prev = torch.tpu.get_matmul_precision()
    torch.tpu.set_matmul_precision(torch.tpu.Precision.HIGHEST)
    warnings.filterwarnings("ignore")
    yield
    torch.tpu.set_matmul_precision(prev)
    torch._dynamo.reset()


def _build(kind):
    torch.manual_seed(0)
    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    if kind == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=2, max_position_embeddings=64, **small))
    if kind == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(max_position_embeddings=64, **small))
    if kind == "t5":
        return tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                         num_heads=4, decoder_start_token_id=0))
    if kind == "vit":
        return tf.ViTForImageClassification(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         intermediate_size=64, image_size=16, patch_size=4, num_labels=3))
    if kind == "swin":
        return tf.SwinForImageClassification(tf.SwinConfig(image_size=16, patch_size=2, embed_dim=8, depths=[1, 1],
                                                           num_heads=[2, 2], window_size=2, num_labels=3))
    raise KeyError(kind)


def _inputs(kind):
    g = torch.Generator().manual_seed(1)  # one batch, so the loss must fall
    if kind in ("vit", "swin"):
        return dict(pixel_values=torch.randn(2, 3, 16, 16, generator=g), labels=torch.randint(0, 3, (2,), generator=g))
    ids = torch.randint(0, 64, (2, 16), generator=g)
    return dict(input_ids=ids, labels=ids.flip(1) if kind == "t5" else ids)


def _train(kind, compiled, steps=3):
    model = _build(kind).to("tpu").train()
    # SGD, not Adam: some gradients are zero in exact arithmetic (the key bias of
    # attention: softmax ignores it), and Adam would scale their float32 rounding noise
    # to full-size steps of either sign
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fwd = torch.compile(model) if compiled else model
    losses = []
    batch = {k: v.to("tpu") for k, v in _inputs(kind).items()}
    for _ in range(steps):
        out = fwd(**batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return losses, model


@pytest.mark.parametrize("kind", ["llama", "bert", "t5", "vit", "swin"])
def test_compiled_training_matches_eager(no_fallback, kind):
    eager, m_eager = _train(kind, compiled=False)
    torch_tpu.metrics.reset()
    compiled, m_compiled = _train(kind, compiled=True)
    rep = torch_tpu.metrics.report()
    assert rep["captures"] > 0 and rep["compiled_runs"] > 0  # it really ran as programs
    assert rep["compiled_eager_nodes"] == 0
    assert eager[-1] < eager[0]
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), atol=1e-4, rtol=1e-4)
    for (n, a), b in zip(m_eager.named_parameters(), m_compiled.parameters()):
        torch.testing.assert_close(b.cpu(), a.cpu(), atol=1e-4, rtol=1e-4, msg=n)


def test_compiled_static_cache_generate_matches_cpu(no_fallback):
    model = _build("llama").eval()
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(3))
    ref = model.generate(ids, max_new_tokens=10, do_sample=False)
    model.to("tpu")
    model.forward = torch.compile(model.forward)
    out = model.generate(ids.to("tpu"), max_new_tokens=10, do_sample=False, cache_implementation="static")
    assert torch.equal(out.cpu(), ref)
    assert torch_tpu.metrics.report()["compiled_runs"] > 0
