"""One architecture on tpu against CPU: forward, backward, greedy generate.

`check(model_type, mode, ...)` returns a result dict:
  status: "pass" | "mismatch" | "fallback" | "error" | "no-build" (the tiny model, or
          inputs it accepts, could not be made on CPU: a harness limit, not a tpu result)
  task, fallbacks (op -> count), worst (max abs difference / tolerance), detail, seconds.
Parity runs at HIGHEST matmul precision (float32-class products), so outputs agree to
float32 rounding; a mismatch is a difference above atol + rtol * |cpu|.
"""
import contextlib
import time
import warnings

import torch

import torch_tpu
import zoo

ATOL = RTOL = 2e-3


def _mode(mode):
    m = {"strict": torch_tpu.EagerMode.DEFER_NEVER, "fuse": torch_tpu.EagerMode.DEFER_AND_FUSE}[mode]
    return torch_tpu.eager_mode(m)


def _compare(name, got, ref, worst):
    got = got.detach().cpu()
    ref = ref.detach()
    if got.shape != ref.shape or got.dtype != ref.dtype:
        raise AssertionError(f"{name}: tpu {tuple(got.shape)} {got.dtype} vs cpu {tuple(ref.shape)} {ref.dtype}")
    g, r = got.double(), ref.double()
    both_nan = torch.isnan(g) & torch.isnan(r)
    same_inf = torch.isinf(g) & (g == r)
    err = ((g - r).abs() - RTOL * r.abs()).masked_fill(both_nan | same_inf, 0).nan_to_num(nan=float("inf"))
    if err.numel():
        m = err.max().item() / ATOL  # > 1: over tolerance
        if m > worst[0]:
            worst[:] = [m, name]


def _outputs(model, inputs):
    out = model(**inputs)
    return out, list(zoo.tensors(out))


def check(model_type, mode="fuse", backward=True, generate=True, no_cache=True):
    t0 = time.time()
    res = dict(model=model_type, mode=mode, status="error", task=None, fallbacks={}, worst=0.0, detail="")
    try:
        task, model = zoo.build(model_type)
        inputs = zoo.make_inputs(model)
        with torch.no_grad():
            ref_out, ref = _outputs(model, inputs)
        if not ref:
            raise LookupError("the model returns no floating tensor")
    except Exception as e:  # the harness could not make this model run on CPU
        res.update(status="no-build", detail=f"{type(e).__name__}: {str(e)[:300]}")
        res["seconds"] = round(time.time() - t0, 2)
        return res
    res["task"] = task
    backward = backward and any(p.requires_grad for p in model.parameters()) and task in ("causal-lm", "base", "seq2seq-lm")
    ref_grads = None
    if backward:
        try:
            model.zero_grad()
            _, outs = _outputs(model, inputs)
            sum(o.float().mean() for _, o in outs).backward()
            ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        except Exception:  # no gradient on CPU either (integer outputs, no_grad inside, ...)
            ref_grads = None
    worst = [0.0, ""]
    stage = "forward"
    torch_tpu.metrics.reset()
    try:
        with warnings.catch_warnings(), _mode(mode), torch.tpu.precision(torch.tpu.Precision.HIGHEST):
            warnings.simplefilter("ignore")
            model.to("tpu")
            tin = zoo.to(inputs, "tpu")
            model.zero_grad()
            with torch.set_grad_enabled(ref_grads is not None):
                _, outs = _outputs(model, tin)
            names = dict(ref)
            for n, o in outs:
                if n in names:
                    _compare(n, o, names[n], worst)
            if set(n for n, _ in outs) != set(names):
                raise AssertionError(f"outputs differ: tpu {sorted(n for n, _ in outs)} cpu {sorted(names)}")
            if ref_grads is not None:
                stage = "backward"
                sum(o.float().mean() for _, o in outs).backward()
                for n, p in model.named_parameters():
                    if n in ref_grads:
                        if p.grad is None:
                            raise AssertionError(f"no gradient for {n} on tpu")
                        _compare(f"grad {n}", p.grad, ref_grads[n], worst)
                res["backward"] = True
            if generate and task in ("causal-lm", "seq2seq-lm"):
                stage = "generate"
                res["generate"] = _generate(model, inputs, no_cache)
                res["generate_cache"] = "on and off" if no_cache else "on"
        res["status"] = "pass" if worst[0] <= 1 else "mismatch"
        if worst[0] > 1:
            res["detail"] = f"{worst[1]}: max |diff| {worst[0] * ATOL:.3g} over tolerance"
        if res.get("generate") not in (None, "same"):
            res["status"] = "mismatch"
            res["detail"] = (res["detail"] + "; " if res["detail"] else "") + "generate: " + res["generate"]
    except Exception as e:
        msg = str(e).strip().splitlines()
        res.update(status="error", detail=f"{stage}: {type(e).__name__}: {(msg[0] if msg else '')[:300]}")
    res["fallbacks"] = dict(torch_tpu.metrics.cpu_fallbacks())
    if res["fallbacks"] and res["status"] == "pass":
        res["status"] = "fallback"
    res["worst"] = round(worst[0], 3)
    res["seconds"] = round(time.time() - t0, 2)
    return res


def _generate(model, inputs, no_cache=True):
    """Greedy tokens on tpu (KV cache on, and off unless no_cache is False) vs CPU: 'same', what differed, or None
    when generate() does not run on CPU either with the harness's inputs."""
    ids = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
    if "input_ids" not in ids:
        return None
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=1)
    cfg = model.generation_config
    if cfg.pad_token_id is None:
        cfg.pad_token_id = 0
    if model.config.is_encoder_decoder and cfg.decoder_start_token_id is None and cfg.bos_token_id is None:
        cfg.decoder_start_token_id = cfg.pad_token_id
    model.to("cpu")
    with torch.no_grad():
        try:
            ref = model.generate(**ids, **kw)
        except Exception:
            return None
        model.to("tpu")
        tin = zoo.to(ids, "tpu")
        for cache in (True, False) if no_cache else (True,):
            out = model.generate(**tin, use_cache=cache, **kw).cpu()
            if not torch.equal(out, ref):
                return f"tokens differ (use_cache={cache}): tpu {out[0].tolist()} cpu {ref[0].tolist()}"
    return "same"
