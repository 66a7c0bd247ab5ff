"""The fused optimizer kernels `aten::_fused_adam_`, `aten::_fused_adamw_` and
`aten::_fused_sgd_` (float and tensor `lr`) on tpu, so `torch.optim.Adam/AdamW/SGD(fused=True)`
(transformers' default optimizer is `adamw_torch_fused`) and `GradScaler` run on the device.

Each kernel is a composition of `torch._foreach_*` ops that tpu lowers, registered at the
PrivateUse1 key, with the arithmetic of CPU's fused kernels: the update is computed in float32
for bfloat16/float16 tensors and rounded once when stored; `grad_scale` divides the gradients
and the unscaled gradients are written back; `found_inf == 1` leaves every tensor unchanged.
Nothing is read on the host: the bias corrections are computed on the device from the
`state_steps` tensors and `found_inf` selects old or new values, so in DeferAndFuse the whole
step fuses into the surrounding program. The one difference from CPU: CPU computes the bias
corrections in float64 from the host step count, here they are float32 on the device
(`1 - beta**step` as `-expm1(step * log(beta))`, accurate to float32 rounding).
"""
import math

import torch

from ._names import dtype_name


def _check(kernel, params, sizes, same_dtype):
    """CPU's checks, in CPU's order: list lengths, then the dtype of params, then of the other lists."""
    for name, lst, want in sizes:
        torch._check(len(lst) == want, lambda: f"Expected {name} to be true, but got false.  (Could this error "
                     "message be improved?  If so, please report an enhancement request to PyTorch.)")
    for i, p in enumerate(params):
        if not p.is_floating_point():
            raise NotImplementedError(f'"{kernel}" not implemented for \'{dtype_name(p.dtype)}\'')
        for lst in same_dtype:
            if lst and lst[i].dtype != p.dtype:
                raise RuntimeError(f"expected scalar type {dtype_name(p.dtype)} but found "
                                   f"{dtype_name(lst[i].dtype)}")


def _opmath(ts):
    return [t.float() if t.dtype in (torch.bfloat16, torch.float16) else t for t in ts]


def _work(ts, found_inf):
    """The values an update computes in place: the tensors themselves when they are float32
    and nothing can skip the step, else float32 copies that _store writes back."""
    if found_inf is None:
        return _opmath(ts)
    return [t.float() if t.dtype in (torch.bfloat16, torch.float16) else t.clone() for t in ts]


def _store(dsts, news, found_inf):
    """dst <- new (rounded to dst's dtype), or dst unchanged where found_inf == 1."""
    if found_inf is not None:
        skip = found_inf == 1.0
        news = [torch.where(skip, d, v) for d, v in zip(dsts, news)]
    pairs = [(d, v) for d, v in zip(dsts, news) if d is not v]
    if pairs:
        torch._foreach_copy_([d for d, _ in pairs], [v for _, v in pairs])


def _host_lr(lr):
    return lr.item() if isinstance(lr, torch.Tensor) and lr.device.type == "cpu" else lr


def _bias_correction(beta, steps):
    """1 - beta**steps, elementwise."""
    return -torch.expm1(steps * math.log(beta)) if beta > 0 else 1 - torch.pow(beta, steps)


def _grads(grads, grad_scale, found_inf, maximize):
    g = _opmath(grads)
    if grad_scale is not None:  # the unscaled gradients are written back, as on CPU
        g = torch._foreach_div(g, grad_scale)
        _store(grads, g, found_inf)
    return torch._foreach_neg(g) if maximize else g


def _adam(decoupled, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    n = len(params)
    _check("fused_adam_kernel", params, [
        ("grads.size() == n_tensors", grads, n), ("exp_avgs.size() == n_tensors", exp_avgs, n),
        ("exp_avg_sqs.size() == n_tensors", exp_avg_sqs, n),
        ("max_exp_avg_sqs.size() == n_tensors" if amsgrad else "max_exp_avg_sqs.empty()", max_exp_avg_sqs,
         n if amsgrad else 0),
        ("state_steps.size() == n_tensors", state_steps, n)], [grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs])
    if n == 0:
        return
    lr = _host_lr(lr)
    g = _grads(grads, grad_scale, found_inf, maximize)
    p, m, v = _work(params, found_inf), _work(exp_avgs, found_inf), _work(exp_avg_sqs, found_inf)
    if weight_decay != 0:
        if decoupled:  # AdamW: p *= 1 - lr * wd
            torch._foreach_mul_(p, 1 - lr * weight_decay)
        else:  # Adam: g += wd * p
            g = torch._foreach_add(g, p, alpha=weight_decay)
    torch._foreach_lerp_(m, g, 1 - beta1)  # m = lerp(m, g, 1 - beta1)
    torch._foreach_mul_(v, beta2)  # v = beta2 * v + (1 - beta2) * g * g
    torch._foreach_addcmul_(v, g, g, value=1 - beta2)
    _store(exp_avgs, m, found_inf)
    _store(exp_avg_sqs, v, found_inf)
    if amsgrad:
        vmax = _work(max_exp_avg_sqs, found_inf)
        torch._foreach_maximum_(vmax, v)
        _store(max_exp_avg_sqs, vmax, found_inf)
        v = vmax
    steps = torch.stack(state_steps).float()  # one vector op for all bias corrections
    step_size = (lr / _bias_correction(beta1, steps)).unbind()
    bc2_sqrt = _bias_correction(beta2, steps).sqrt().unbind()
    denom = torch._foreach_add(torch._foreach_div(torch._foreach_sqrt(v), bc2_sqrt), eps)
    # p -= lr / (1 - beta1**step) * m / (sqrt(v) / sqrt(1 - beta2**step) + eps)
    torch._foreach_addcdiv_(p, torch._foreach_mul(m, step_size), denom, value=-1)
    _store(params, p, found_inf)


def _sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
         is_first_step, grad_scale=None, found_inf=None):
    n = len(params)
    _check("fused_sgd_kernel", params, [
        ("grads.size() == n_tensors", grads, n),
        ("momentum_buffer_list.size() == n_tensors", momentum_buffer_list, 0 if momentum == 0 else n)],
        [grads, momentum_buffer_list])
    if n == 0:
        return
    lr = _host_lr(lr)
    g = _grads(grads, grad_scale, found_inf, maximize)
    p = _work(params, found_inf)
    if weight_decay != 0:
        g = torch._foreach_add(g, p, alpha=weight_decay)
    if momentum != 0:  # buf = g on the first step, else momentum * buf + (1 - dampening) * g
        if is_first_step:
            buf = g
        else:
            buf = _work(momentum_buffer_list, found_inf)
            torch._foreach_mul_(buf, momentum)
            torch._foreach_add_(buf, g, alpha=1 - dampening)
        _store(momentum_buffer_list, buf, found_inf)
        g = torch._foreach_add(g, buf, alpha=momentum) if nesterov else buf
    torch._foreach_sub_(p, torch._foreach_mul(g, lr))  # p -= lr * g
    _store(params, p, found_inf)


# (op, kernel, dispatch key), registered by torch_tpu at start-up
KERNELS = [(name, fn, "PrivateUse1") for names, fn in (
    (("_fused_adam_", "_fused_adam_.tensor_lr"), lambda *a, **k: _adam(False, *a, **k)),
    (("_fused_adamw_", "_fused_adamw_.tensor_lr"), lambda *a, **k: _adam(True, *a, **k)),
    (("_fused_sgd_", "_fused_sgd_.tensor_lr"), _sgd)) for name in names]
