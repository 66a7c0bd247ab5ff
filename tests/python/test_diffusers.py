"""diffusers on tpu (random weights, built from configs): a tiny UNet2DConditionModel (forward and
backward), a tiny AutoencoderKL (encode + decode) and a scheduler's denoising loop written out as a
pipeline runs it, against CPU at HIGHEST matmul precision, with no CPU fallback."""
import copy
import warnings

import pytest
import torch

from conftest import assert_same

diffusers = pytest.importorskip("diffusers")

TOL = dict(rtol=1e-4, atol=1e-5)


def _unet():
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
        cross_attention_dim=8, attention_head_dim=2, norm_num_groups=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))


def _vae():
    torch.manual_seed(0)
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 16), latent_channels=4,
        norm_num_groups=4, layers_per_block=1, sample_size=16)


@pytest.fixture(scope="module")
def unets():
    cpu = _unet()
    return cpu, copy.deepcopy(cpu).to("tpu")


def _unet_inputs():
    torch.manual_seed(1)
    return torch.randn(2, 4, 8, 8), torch.tensor([10, 500]), torch.randn(2, 5, 8)


def _to(ts, dev):
    return [t.to(dev) for t in ts]


def test_unet_forward(unets, no_fallback, highest):
    cpu, tpu = unets
    args = _unet_inputs()
    with torch.no_grad():
        want = cpu(*args).sample
        got = tpu(*_to(args, "tpu")).sample
    assert_same(got, want, **TOL)


def test_unet_backward(unets, no_fallback, highest):
    cpu, tpu = unets
    x, t, e = _unet_inputs()
    target = torch.randn(2, 4, 8, 8)
    grads = {}
    for dev, m in (("cpu", cpu), ("tpu", tpu)):
        m.zero_grad(set_to_none=True)
        xe = e.clone().to(dev).requires_grad_()
        loss = torch.nn.functional.mse_loss(m(x.to(dev), t.to(dev), xe).sample, target.to(dev))
        loss.backward()
        grads[dev] = (loss.detach(), xe.grad, {n: p.grad for n, p in m.named_parameters()})
    assert_same(grads["tpu"][0], grads["cpu"][0], **TOL)
    assert_same(grads["tpu"][1], grads["cpu"][1], rtol=1e-4, atol=1e-6)
    want = grads["cpu"][2]
    assert want.keys() == grads["tpu"][2].keys()
    for name, g in grads["tpu"][2].items():
        assert g is not None, name
        assert_same(g, want[name], rtol=1e-3, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_vae_encode_decode(no_fallback, highest):
    cpu = _vae()
    tpu = copy.deepcopy(cpu).to("tpu")
    torch.manual_seed(2)
    img = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = cpu.encode(img).latent_dist
        got = tpu.encode(img.to("tpu")).latent_dist
        assert_same(got.mean, want.mean, **TOL)
        assert_same(got.std, want.std, **TOL)
        assert_same(got.kl(), want.kl(), rtol=1e-4, atol=1e-4)
        z = want.mean * 0.18215
        assert_same(tpu.decode(z.to("tpu")).sample, cpu.decode(z).sample, **TOL)
        # full forward with a sampled latent (the generator is a CPU one, as in diffusers' randn_tensor)
        out_cpu = cpu(img, sample_posterior=True, generator=torch.Generator().manual_seed(3)).sample
        out_tpu = tpu(img.to("tpu"), sample_posterior=True, generator=torch.Generator().manual_seed(3)).sample
        assert_same(out_tpu, out_cpu, **TOL)


@pytest.mark.parametrize("scheduler", ["DDPMScheduler", "EulerDiscreteScheduler"])
def test_denoising_loop(unets, scheduler, no_fallback, highest):
    """what a text-to-image pipeline does after the text encoder: classifier-free guidance over
    4 scheduler steps, the scheduler's state on the device (set_timesteps(device=...))"""
    cpu, tpu = unets
    torch.manual_seed(4)
    cond = torch.randn(2, 5, 8)  # [uncond, cond] text embeddings of one prompt
    latents0 = torch.randn(1, 4, 8, 8)
    outs = {}
    for dev, unet in (("cpu", cpu), ("tpu", tpu)):
        sched = getattr(diffusers, scheduler)(num_train_timesteps=100)
        with warnings.catch_warnings():  # numpy 2's __array__ copy notice for a CPU tensor (Euler), not tpu
            warnings.simplefilter("ignore", DeprecationWarning)
            sched.set_timesteps(4, device=dev)
        gen = torch.Generator().manual_seed(5)
        emb = cond.to(dev)
        latents = latents0.to(dev) * sched.init_noise_sigma
        with torch.no_grad():
            for t in sched.timesteps:
                inp = sched.scale_model_input(torch.cat([latents] * 2), t)
                noise_u, noise_c = unet(inp, t, encoder_hidden_states=emb).sample.chunk(2)
                noise = noise_u + 7.5 * (noise_c - noise_u)
                latents = sched.step(noise, t, latents, generator=gen).prev_sample
        outs[dev] = latents
    assert torch.isfinite(outs["cpu"]).all()
    assert_same(outs["tpu"], outs["cpu"], rtol=1e-4, atol=1e-4)
