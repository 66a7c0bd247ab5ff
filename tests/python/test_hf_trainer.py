"""HuggingFace on tpu without a device argument: transformers.Trainer (default fused AdamW,
bf16 mixed precision), accelerate's device, pipelines; and the fused optimizer kernels
(aten::_fused_adam_/_fused_adamw_/_fused_sgd_) against CPU's fused kernels."""
import os
import subprocess
import sys

import pytest
import torch

import torch_tpu
from conftest import assert_same

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")


# ---- fused optimizer kernels -------------------------------------------------------------

OPTIMS = [
    ("adamw", torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    ("adamw_tensor_lr", torch.optim.AdamW, dict(lr=torch.tensor(1e-2), weight_decay=0.1)),
    ("adam_amsgrad_wd", torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    ("adam_maximize_tensor_lr", torch.optim.Adam, dict(lr=torch.tensor(1e-2), maximize=True)),
    ("sgd", torch.optim.SGD, dict(lr=0.1)),
    ("sgd_nesterov_wd", torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("sgd_dampening", torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.2)),
]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=8e-3, atol=1e-6)}  # bf16: 1 ulp


def _train_params(cls, kw, device, dtype, steps=3):
    torch.manual_seed(0)
    init = [torch.randn(5, 3), torch.randn(7), torch.randn(())]
    grads = [[torch.randn_like(p) for p in init] for _ in range(steps)]
    params = [p.to(dtype).to(device).requires_grad_() for p in init]
    opt = cls(params, fused=True, **kw)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.to(dtype).to(device)
        opt.step()
    return params, opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name,cls,kw", OPTIMS, ids=[o[0] for o in OPTIMS])
def test_fused_optimizer_matches_cpu(name, cls, kw, dtype, no_fallback):
    expected, _ = _train_params(cls, kw, "cpu", dtype)
    actual, opt = _train_params(cls, kw, "tpu", dtype)
    for a, e in zip(actual, expected):
        assert_same(a.detach(), e.detach(), **TOL[dtype])
    for state in opt.state.values():  # optimizer state stays on the device
        assert all(t.device.type == "tpu" for t in state.values() if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("found_inf", [0.0, 1.0], ids=["finite", "found_inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_fused_kernels_grad_scale_found_inf(dtype, found_inf, no_fallback):
    """GradScaler's arguments: grads are unscaled and written back; found_inf == 1 skips the step."""
    torch.manual_seed(0)
    shapes = [(4, 3), (5,)]
    vals = [[torch.randn(s).to(dtype) for s in shapes] for _ in range(6)]
    out = {}
    for dev in ("cpu", "tpu"):
        p, g, m, v, vmax, buf = ([t.clone().to(dev) for t in group] for group in vals)
        p2, g2 = [t.clone() for t in p], [t.clone() for t in g]
        v, vmax = [t.abs() for t in v], [t.abs() for t in vmax]
        steps = [torch.tensor(3.0, device=dev) for _ in shapes]
        scale, inf = torch.tensor(2.0, device=dev), torch.tensor(found_inf, device=dev)
        torch._fused_adamw_(p, g, m, v, vmax, steps, lr=torch.tensor(0.01, device=dev), beta1=0.9, beta2=0.999,
                            weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=False, grad_scale=scale, found_inf=inf)
        torch._fused_sgd_(p2, g2, buf, weight_decay=0.1, momentum=0.9, lr=0.1, dampening=0.0, nesterov=True,
                          maximize=True, is_first_step=False, grad_scale=scale, found_inf=inf)
        out[dev] = p + g + m + v + vmax + p2 + g2 + buf
    for a, e in zip(out["tpu"], out["cpu"]):
        assert_same(a, e, **TOL[dtype])
    if found_inf:
        for a, orig in zip(out["tpu"], vals[0] + vals[1]):
            assert torch.equal(a.cpu(), orig)


def _adam_args(n, amsgrad=False, dtype=torch.float32, steps=None):
    ts = lambda: [torch.zeros(3, dtype=dtype) for _ in range(n)]  # noqa: E731
    return ts(), ts(), ts(), ts(), ts() if amsgrad else [], [torch.ones(()) for _ in range(n if steps is None else steps)]


ADAM_KW = dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, maximize=False)


@pytest.mark.parametrize("case", ["grads", "max_exp_avg_sqs_empty", "max_exp_avg_sqs_size", "state_steps",
                                  "dtype", "int"])
def test_fused_kernels_errors_match_cpu(case):
    def call(dev):
        p, g, m, v, vmax, s = _adam_args(2, amsgrad=case == "max_exp_avg_sqs_size",
                                         dtype=torch.int64 if case == "int" else torch.float32,
                                         steps=1 if case == "state_steps" else None)
        if case == "grads":
            g = g[:1]
        if case == "max_exp_avg_sqs_empty":
            vmax = [torch.zeros(3)]
        if case == "max_exp_avg_sqs_size":
            vmax = vmax[:1]
        if case == "dtype":
            g = [t.bfloat16() for t in g]
        args = [[t.to(dev) for t in lst] for lst in (p, g, m, v, vmax, s)]
        torch._fused_adam_(*args, amsgrad=case == "max_exp_avg_sqs_size", **ADAM_KW)

    with pytest.raises(Exception) as cpu:
        call("cpu")
    with pytest.raises(type(cpu.value)) as tpu:
        call("tpu")
    assert str(tpu.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_fused_sgd_errors_match_cpu():
    p, g = [torch.zeros(3)] * 2, [torch.zeros(3)] * 2
    kw = dict(weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False, maximize=False,
              is_first_step=False)
    with pytest.raises(RuntimeError, match=r"momentum_buffer_list.size\(\) == n_tensors"):
        torch._fused_sgd_([t.tpu() for t in p], [t.tpu() for t in g], [torch.zeros(3, device="tpu")], **kw)
    with pytest.raises(RuntimeError, match=r"grads.size\(\) == n_tensors"):
        torch._fused_sgd_([t.tpu() for t in p], [g[0].tpu()], [], **{**kw, "momentum": 0.0})


def test_fused_step_is_one_program_in_defer_and_fuse(no_fallback):
    """A whole fused AdamW step (state_steps increment included) runs as one program, no host read."""
    torch.manual_seed(0)
    ps = [torch.randn(8, 4, device="tpu", requires_grad=True) for _ in range(4)]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(ps, lr=1e-3, fused=True)
    with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE):
        torch.tpu.synchronize()
        torch_tpu.metrics.reset()
        opt.step()
        torch.tpu.synchronize()
        assert torch_tpu.metrics.executions == 1
        assert torch_tpu.metrics.d2h_transfers == 0


def test_torch_optim_knows_tpu_for_fused_and_foreach():
    from torch.optim.optimizer import _get_fused_kernels_supported_devices
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    assert "tpu" in _get_fused_kernels_supported_devices()
    assert "tpu" in _get_foreach_kernels_supported_devices()


# ---- accelerate and Trainer ---------------------------------------------------------------

@pytest.fixture
def fresh_accelerate():
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    PartialState._reset_state()


def test_accelerate_and_training_args_agree_on_tpu(fresh_accelerate, tmp_path):
    from accelerate import Accelerator
    from transformers import TrainingArguments

    assert Accelerator().device == torch.device("tpu:0")
    assert TrainingArguments(output_dir=str(tmp_path), report_to=[]).device == torch.device("tpu:0")


def _child_env(**env):
    code = "import os, torch; print(os.environ.get('ACCELERATE_TORCH_DEVICE'))"
    full = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_TORCH_DEVICE", "TORCH_TPU_ACCELERATE_DEVICE")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_accelerate_device_user_value_wins_and_children_recompute():
    assert _child_env(ACCELERATE_TORCH_DEVICE="cpu") == "cpu"
    # a torchrun worker that inherited the parent's value (set by torch_tpu) takes its own index
    assert _child_env(ACCELERATE_TORCH_DEVICE="tpu:0", TORCH_TPU_ACCELERATE_DEVICE="tpu:0", LOCAL_RANK="1",
                      TORCH_TPU_NUM_DEVICES="2") == "tpu:1"


def _tiny_llama(vocab=64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                        bos_token_id=1, eos_token_id=2, pad_token_id=0))


def _train(tmp_path, model=None, **args):
    from transformers import Trainer, TrainingArguments

    model = model or _tiny_llama()
    data = [{"input_ids": (torch.arange(16) * 3 + i) % 64, "labels": (torch.arange(16) * 3 + i) % 64}
            for i in range(32)]
    targs = TrainingArguments(output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=8, max_steps=6,
                              learning_rate=1e-2, logging_steps=1, save_strategy="no", disable_tqdm=True, **args)
    trainer = Trainer(model=model, args=targs, train_dataset=data)
    batch = next(iter(trainer.get_train_dataloader()))
    assert targs.device == trainer.accelerator.device == torch.device("tpu:0")
    assert batch["input_ids"].device == torch.device("tpu:0")
    trainer.train()
    assert isinstance(trainer.optimizer.optimizer, torch.optim.AdamW)
    assert trainer.optimizer.optimizer.defaults["fused"] is True  # transformers' default: adamw_torch_fused
    assert next(model.parameters()).device == torch.device("tpu:0")
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.3, losses
    return model, trainer


def test_trainer_trains_on_tpu_by_default(fresh_accelerate, tmp_path, no_fallback):
    _train(tmp_path)


def test_trainer_bf16_mixed_precision(fresh_accelerate, tmp_path, no_fallback):
    model = _tiny_llama()
    seen = []
    model.model.layers[0].mlp.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    _, trainer = _train(tmp_path, model, bf16=True)
    assert trainer.accelerator.mixed_precision == "bf16"
    assert seen and all(d == torch.bfloat16 for d in seen)  # autocast on tpu ran the MLP in bf16
    assert next(model.parameters()).dtype == torch.float32  # master weights stay float32


# ---- pipelines ----------------------------------------------------------------------------

def test_pipeline_text_generation_matches_cpu(highest, no_fallback):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, pipeline

    vocab = {c: i for i, c in enumerate(["<unk>", "<s>", "</s>"] + list("abcdefghijklmnopqrstuvwxyz "))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    model = _tiny_llama(vocab=len(vocab)).eval()
    out = {}
    for dev in ("cpu", "tpu"):
        pipe = pipeline("text-generation", model=model, tokenizer=tok, device=dev)
        assert pipe.device.type == dev
        out[dev] = pipe(["hello world", "abc"], max_new_tokens=8, do_sample=False)
    assert out["tpu"] == out["cpu"]
    assert len(out["tpu"][0][0]["generated_text"]) > len("hello world")


def test_pipeline_image_classification_matches_cpu(highest, no_fallback):
    import numpy as np
    from PIL import Image
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor, pipeline

    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(image_size=224, patch_size=32, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=4, num_labels=5)).eval()
    proc = ViTImageProcessor()
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)) for _ in range(2)]
    out = {}
    for dev in ("cpu", "tpu"):
        pipe = pipeline("image-classification", model=model, image_processor=proc, device=dev)
        assert pipe.device.type == dev
        out[dev] = pipe(images, top_k=5)
    for a, e in zip(out["tpu"], out["cpu"]):
        assert [r["label"] for r in a] == [r["label"] for r in e]
        torch.testing.assert_close([r["score"] for r in a], [r["score"] for r in e], rtol=1e-5, atol=1e-6)
