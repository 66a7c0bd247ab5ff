"""CI's representative subset of the HuggingFace architecture sweep (tests/models/sweep.py
runs all of them and writes docs/MODELS.md): decoders (dense, MoE, hybrid linear
attention), encoders, encoder-decoders, vision, audio and a dual encoder, each built tiny
from its config, compared with CPU in forward, gradients and greedy generate()."""
import os
import sys

import pytest

# Tests count compiles: no persistent cache (as tests/python/conftest.py). No conftest.py
# here: a second module named conftest would shadow tests/python's in one pytest run.
os.environ.setdefault("TORCH_TPU_CACHE_DIR", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

tf = pytest.importorskip("transformers")

import check  # noqa: E402

FUSE = ["llama", "gpt2", "mixtral", "qwen3_next", "bert", "t5", "bart", "vit", "whisper", "clip", "wav2vec2"]
STRICT = ["qwen2", "roberta", "convnext"]


def _assert_pass(r):
    assert r["status"] == "pass", r
    assert r["fallbacks"] == {}, r
    if r["task"] in ("causal-lm", "seq2seq-lm"):
        assert r.get("generate") == "same", r


@pytest.mark.parametrize("model_type", FUSE)
def test_architecture_defer_and_fuse(model_type):
    _assert_pass(check.check(model_type, "fuse"))


@pytest.mark.parametrize("model_type", STRICT)
def test_architecture_strict(model_type):
    _assert_pass(check.check(model_type, "strict"))


def test_harness_detects_a_mismatch(monkeypatch):
    """The comparison can fail: a model whose tpu weights differ from CPU's is reported."""
    import torch
    import zoo

    built = zoo.build

    def build(model_type, task=None, seed=0):
        task, m = built(model_type, task, seed)
        orig = m.to

        def to(*a, **k):
            out = orig(*a, **k)
            if out.device.type == "tpu":
                with torch.no_grad():
                    next(out.parameters()).add_(0.5)
            return out

        m.to = to
        return task, m

    monkeypatch.setattr(zoo, "build", build)
    r = check.check("bert", "fuse", backward=False, generate=False)
    assert r["status"] == "mismatch", r
