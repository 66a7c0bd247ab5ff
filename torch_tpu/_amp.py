"""The AMP kernels `aten::_amp_foreach_non_finite_check_and_unscale_` and `aten::_amp_update_scale_`
on tpu, so `torch.amp.GradScaler("tpu")` runs on the device as it does on CUDA.

Both are compositions of ops tpu lowers, registered at the PrivateUse1 key, with the semantics and
error messages of CPU's kernels ("CPU tensor" reads "tpu tensor"). Nothing is read on the host:

* unscale: each gradient is multiplied by `inv_scale` in float32 (bfloat16/float16 gradients are
  rounded once when stored back, as CPU's opmath does), and `found_inf` is set to 1 on the device
  when any gradient holds an inf or nan (else left as it was: GradScaler accumulates into it).
* update: the new scale and growth tracker are device-side selects on `found_inf`; the products
  `scale * factor` are computed in float64 and rounded to float32, as CPU does.

The one difference from CPU: every argument is validated before anything is written, so a list
with a bad gradient after good ones raises without unscaling the good ones (CPU unscales those).
"""
import torch

from ._names import dtype_name

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _on_tpu(t):
    return t.device.type == "tpu"


def _non_finite_check_and_unscale_(scaled_grads, found_inf, inv_scale):
    if len(scaled_grads) == 0:
        return
    torch._check(_on_tpu(inv_scale), lambda: "inv_scale must be a tpu tensor.")
    torch._check(_on_tpu(found_inf), lambda: "found_inf must be a tpu tensor.")
    torch._check(inv_scale.numel() == 1, lambda: "inv_scale must be a 1-element tensor.")
    torch._check(found_inf.numel() == 1, lambda: "found_inf must be a 1-element tensor.")
    torch._check(inv_scale.dtype == torch.float32, lambda: "inv_scale must be a float tensor.")
    torch._check(found_inf.dtype == torch.float32, lambda: "found_inf must be a float tensor.")
    for t in scaled_grads:
        torch._check(_on_tpu(t), lambda: "one of scaled_grads was not a tpu tensor.")
        torch._check(t.layout == torch.strided, lambda: "one of scaled_grads was not a strided tensor.")
        if t.dtype not in _FLOATS:
            raise NotImplementedError('"_amp_foreach_non_finite_check_and_unscale_cpu" not implemented for '
                                      f"'{dtype_name(t.dtype)}'")
    grads = [t for t in scaled_grads if t.numel() > 0]
    if not grads:
        return
    work = [t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for t in grads]
    # x * 0 is 0 for a finite x and nan for inf/nan: one sum per tensor tells whether any is non-finite
    sums = torch.stack([z.sum().float() for z in torch._foreach_mul(work, 0.0)])
    bad = torch.isnan(sums.sum())
    found_inf.copy_(torch.where(bad, torch.ones_like(found_inf), found_inf))
    torch._foreach_copy_(grads, torch._foreach_mul(work, inv_scale.reshape(())))


def _update_scale_(current_scale, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor,
                   growth_interval):
    torch._check(_on_tpu(growth_tracker), lambda: "growth_tracker must be a tpu tensor.")
    torch._check(_on_tpu(current_scale), lambda: "current_scale must be a tpu tensor.")
    torch._check(_on_tpu(found_inf), lambda: "found_inf must be a tpu tensor.")
    torch._check(growth_tracker.numel() == 1, lambda: "growth_tracker must be a 1-element tensor.")
    torch._check(current_scale.numel() == 1, lambda: "current_scale must be a 1-element tensor.")
    torch._check(found_inf.numel() == 1, lambda: "found_inf must be a 1-element tensor.")
    torch._check(growth_tracker.dtype == torch.int32, lambda: "growth_tracker must be an int tensor.")
    torch._check(current_scale.dtype == torch.float32, lambda: "current_scale must be a float tensor.")
    torch._check(found_inf.dtype == torch.float32, lambda: "found_inf must be a float tensor.")
    scale, tracker = current_scale.double(), growth_tracker
    inf = found_inf != 0  # nan counts as found, as CPU's `if (*found_inf)`
    successful = tracker + 1
    grow = successful == growth_interval
    backed_off = (scale * scale_backoff_factor).float()
    grown = (scale * scale_growth_factor).float()
    grown = torch.where(torch.isfinite(grown), grown, current_scale)  # never grow past float32 to inf
    new_scale = torch.where(inf, backed_off, torch.where(grow, grown, current_scale))
    zero = torch.zeros_like(tracker)
    new_tracker = torch.where(inf | grow, zero, successful)
    current_scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    return current_scale


# (op, kernel, dispatch key), registered by torch_tpu at start-up
KERNELS = [
    ("_amp_foreach_non_finite_check_and_unscale_", _non_finite_check_and_unscale_, "PrivateUse1"),
    ("_amp_update_scale_", _update_scale_, "PrivateUse1"),
]
