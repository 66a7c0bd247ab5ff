"""Models the op tests never name: standard torch.nn building blocks (CNN with
batch/group norm and pooling, Transformer encoder, LSTM, GRU, multi-head
attention, a small encoder-decoder with instance norm, transposed conv and
interpolation, an embedding MLP) run forward and backward on tpu with no CPU
fallback, and match CPU (matmuls at HIGHEST)."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(8, 16, 3, stride=2), nn.GroupNorm(4, 16), nn.SiLU(),
                               nn.AdaptiveAvgPool2d((3, 3)), nn.Flatten(), nn.Linear(144, 10))

    def forward(self, x):
        return self.f(x)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.MultiheadAttention(24, 3, batch_first=True)

    def forward(self, x):
        return self.a(x, x, x, need_weights=True)[0]


MODELS = {
    "cnn": (CNN, lambda: torch.randn(4, 3, 16, 16), lambda o: F.cross_entropy(o, torch.arange(4, device=o.device))),
    "transformer": (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2),
                    lambda: torch.randn(2, 7, 32), lambda o: o.pow(2).mean()),
    "lstm": (lambda: nn.LSTM(12, 16, num_layers=2, batch_first=True), lambda: torch.randn(3, 5, 12),
             lambda o: o[0].sum() + o[1][1].sum()),
    "gru": (lambda: nn.GRU(12, 16, batch_first=True, bidirectional=True), lambda: torch.randn(3, 5, 12),
            lambda o: o[0].abs().mean()),
    "attention": (Attention, lambda: torch.randn(2, 6, 24), lambda o: o.sum()),
    "encoder_decoder": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.InstanceNorm2d(4, affine=True),
                                              nn.LeakyReLU(0.1), nn.ConvTranspose2d(4, 2, 2, stride=2),
                                              nn.Upsample(scale_factor=0.5, mode="bilinear"), nn.Tanh()),
                        lambda: torch.randn(2, 2, 8, 8), lambda o: o.sum()),
    "embedding_mlp": (lambda: nn.Sequential(nn.Embedding(50, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3),
                                            nn.LogSoftmax(-1)),
                      lambda: torch.randint(0, 50, (4, 5)),
                      lambda o: F.nll_loss(o.reshape(-1, 3), torch.zeros(20, dtype=torch.long, device=o.device))),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_forward_backward_native_and_matches_cpu(name):
    make, inp, loss_fn = MODELS[name]
    torch.manual_seed(0)
    cpu = make()
    tpu = copy.deepcopy(cpu).to("tpu")
    x = inp()
    torch_tpu.metrics.reset()
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST), warnings.catch_warnings():
        warnings.simplefilter("error")  # a CPU fallback warns: fail
        lc = loss_fn(cpu(x))
        lt = loss_fn(tpu(x.to("tpu")))
        lc.backward()
        lt.backward()
    assert torch_tpu.metrics.cpu_fallbacks() == {}
    torch.testing.assert_close(lt.cpu(), lc, rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}.{n}: {m}")
