"""The HuggingFace architecture sweep: every transformers model_type on tpu vs CPU.

    .venv/bin/python tests/models/sweep.py                 # all architectures, DeferAndFuse, writes docs/MODELS.md
    .venv/bin/python tests/models/sweep.py --mode strict   # Strict mode instead
    .venv/bin/python tests/models/sweep.py llama gpt2 -v   # some architectures, printed

Each architecture runs in a worker process (a crash or a hang costs only that model:
the worker is restarted; --timeout seconds each). Results go to a JSON-lines file and,
for a full sweep, to docs/MODELS.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

_WORKER = r"""
import json, os, sys, warnings
sys.path.insert(0, {here!r})
warnings.filterwarnings("ignore")
import torch, transformers
transformers.logging.set_verbosity_error()
import check
for line in sys.stdin:
    req = json.loads(line)
    res = check.check(req["model"], req["mode"], backward=req["backward"], generate=req["generate"],
                      no_cache=req["no_cache"])
    sys.stdout.write("RESULT " + json.dumps(res) + "\n")
    sys.stdout.flush()
"""


class Worker:
    def __init__(self):
        env = dict(os.environ, TORCH_TPU_CACHE_DIR=os.environ.get("TORCH_TPU_CACHE_DIR", ""))
        self.p = subprocess.Popen([sys.executable, "-c", _WORKER.format(here=HERE)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)

    def run(self, req, timeout):
        import selectors

        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        end = time.time() + timeout
        while True:
            left = end - time.time()
            if left <= 0 or not sel.select(left):
                return None  # timed out
            line = self.p.stdout.readline()
            if not line:
                return False  # the process died
            if line.startswith("RESULT "):
                return json.loads(line[7:])

    def kill(self):
        self.p.kill()
        self.p.wait()


def _run_all(models, mode, timeout, backward, generate, no_cache, on_result):
    w = Worker()
    for m in models:
        t = time.time()
        r = w.run(dict(model=m, mode=mode, backward=backward, generate=generate, no_cache=no_cache), timeout)
        if not isinstance(r, dict):
            w.kill()
            r = dict(model=m, mode=mode, status="error", task=None, fallbacks={}, worst=0.0,
                     detail=f"timed out after {timeout} s" if r is None else "the worker process died (crash)",
                     seconds=round(time.time() - t, 2))
            w = Worker()
        on_result(r)
    w.kill()


def sweep(models, mode, timeout, backward=True, generate=True, verbose=False, out=None, jobs=1, no_cache=True):
    """Runs each model in one of `jobs` worker processes; returns the results in order."""
    import threading

    results = {}
    lock = threading.Lock()

    def on_result(r):
        with lock:
            results[r["model"]] = r
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()
            if verbose:
                fb = f" fallbacks={r['fallbacks']}" if r["fallbacks"] else ""
                print(f"[{len(results)}/{len(models)}] {r['model']}: {r['status']} ({r['seconds']} s){fb} {r['detail']}",
                      flush=True)

    threads = [threading.Thread(target=_run_all, args=(models[i::jobs], mode, timeout, backward, generate, no_cache,
                                                                 on_result))
               for i in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[m] for m in models]


def summarize(results):
    built = [r for r in results if r["status"] != "no-build"]
    count = {s: sum(r["status"] == s for r in built) for s in ("pass", "mismatch", "fallback", "error")}
    gen = [r for r in built if r.get("generate") is not None or (r["task"] in ("causal-lm", "seq2seq-lm") and r["status"] == "error")]
    return dict(total=len(results), built=len(built), no_build=len(results) - len(built), **count,
                gen_total=len(gen), gen_same=sum(r.get("generate") == "same" for r in gen),
                causal=[r for r in built if r["task"] == "causal-lm"])


def no_build_reason(detail):
    """A coarse class of why the harness could not run an architecture on CPU."""
    if any(p in detail for p in ("timm", "natten", "detectron2", "torchaudio")):
        return "needs a package that does not install here (timm, natten, detectron2, torchaudio)"
    if ("required positional" in detail or "LookupError" in detail or "specify" in detail or "not-None" in detail
            or "cannot be `None`" in detail or "bbox" in detail.lower()):
        return "needs inputs the harness does not make (image tokens, grids, boxes, video inference states, ...)"
    if any(p in detail for p in ("ValidationError", "ValueError", "AssertionError")):
        return "the config's own checks reject the generic shrink"
    return "the shrunk config builds a model that fails on CPU (mostly shape mismatches)"


def write_markdown(results, mode, seconds, path):
    s = summarize(results)
    causal = s.pop("causal")
    causal_same = sum(r.get("generate") == "same" for r in causal)
    pct = lambda a, b: f"{100.0 * a / b:.1f}%" if b else "n/a"
    lines = [
        "# HuggingFace architectures on tpu",
        "",
        "Written by `.venv/bin/python tests/models/sweep.py` (all architectures; `--mode strict` for",
        "Strict mode). Every transformers `model_type` that has a base model class is built",
        "from its config class's defaults with every size shrunk (`tests/models/zoo.py`), with",
        "random weights and a fixed seed, on CPU and then moved to `tpu`; forward outputs,",
        "parameter gradients of a scalar loss (the mean of every floating output) and, for causal",
        "and seq2seq LMs, 4 greedy tokens from `generate()` (with the KV cache, and also with",
        "`use_cache=False` where the table says \"cache on and off\"; `--cache-only` skips that)",
        "are compared with CPU at HIGHEST matmul precision (tolerance 2e-3 absolute + 2e-3 relative).",
        "Parameters that the init leaves constant get a little noise (zoo.py says why).",
        "transformers 5.23.0, torch 2.13.0, XLA CPU PJRT plugin. timm and torchvision do not",
        "import beside this torch build, so models whose backbone needs timm do not build here.",
        "",
        f"Mode: {dict(fuse='DeferAndFuse', strict='Strict')[mode]}. {s['total']} architectures; the sweep took"
        f" {seconds / 60:.1f} min of worker time (divided by the number of workers).",
        "",
        "| result | architectures |",
        "|---|---|",
        f"| built and ran on CPU (the tpu denominator) | {s['built']} |",
        f"| pass (no CPU fallback) | {s['pass']} ({pct(s['pass'], s['built'])}) |",
        f"| pass through the CPU fallback for some ops | {s['fallback']} |",
        f"| mismatch | {s['mismatch']} |",
        f"| error on tpu | {s['error']} |",
        f"| did not build offline, or the harness has no inputs it accepts (not run on tpu) | {s['no_build']} |",
        f"| causal LMs: same greedy tokens as CPU | {causal_same} of {len(causal)} |",
        "",
        "Architectures not run on tpu, by why the harness could not run them on CPU (a limit of",
        "`zoo.py`'s generic shrinking and inputs, not a tpu result; such a model built by hand",
        "with a working config is an ordinary tpu test):",
        "",
        "| reason | architectures |",
        "|---|---|",
    ]
    reasons = {}
    for r in results:
        if r["status"] == "no-build":
            k = no_build_reason(r["detail"])
            reasons[k] = reasons.get(k, 0) + 1
    lines += [f"| {k} | {v} |" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])]
    lines += [
        "",
        "## Per architecture",
        "",
        "| model_type | task | result | detail |",
        "|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: r["model"]):
        detail = r["detail"].replace("|", "/").replace("\n", " ")
        if r["fallbacks"]:
            detail = "fell back: " + ", ".join(sorted(r["fallbacks"])) + ("; " + detail if detail else "")
        extra = []
        if r.get("backward"):
            extra.append("grads")
        if r.get("generate") == "same":
            extra.append("generate" + (f", cache {r['generate_cache']}" if r.get("generate_cache") else ""))
        res = r["status"] + (f" ({', '.join(extra)})" if extra and r["status"] == "pass" else "")
        lines.append(f"| {r['model']} | {r['task'] or ''} | {res} | {detail[:220]} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--mode", default="fuse", choices=["fuse", "strict"])
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--no-generate", action="store_true")
    ap.add_argument("--cache-only", action="store_true", help="generate() with the KV cache only (not also use_cache=False)")
    ap.add_argument("--jsonl", default=None, help="results file (default /tmp/torch_tpu_models_<mode>[_some].jsonl)")
    ap.add_argument("--markdown", default=None, help="default: docs/MODELS.md for a full sweep")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--resume", action="store_true", help="keep the results already in the results file")
    ap.add_argument("--markdown-only", action="store_true", help="rewrite the markdown from the results file")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    import zoo

    models = a.models or zoo.architectures()
    jsonl = a.jsonl or f"/tmp/torch_tpu_models_{a.mode}{'_some' if a.models else ''}.jsonl"
    done = {}
    if (a.resume or a.markdown_only) and os.path.exists(jsonl):
        with open(jsonl) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:  # a line cut short by an interrupted run
                    continue
                done[r["model"]] = r
    if a.markdown_only:
        write_markdown([done[m] for m in models if m in done], a.mode,
                       sum(r["seconds"] for r in done.values()) / max(1, a.jobs), a.markdown or os.path.join(ROOT, "docs", "MODELS.md"))
        return
    t = time.time()
    took = sum(r["seconds"] for r in done.values()) / max(1, a.jobs)
    with open(jsonl, "a" if a.resume else "w") as f:
        todo = [m for m in models if m not in done]
        new = sweep(todo, a.mode, a.timeout, not a.no_backward, not a.no_generate, a.verbose or bool(a.models), f,
                    a.jobs, not a.cache_only)
    done.update({r["model"]: r for r in new})
    res = [done[m] for m in models]
    took += time.time() - t
    md = a.markdown or (None if a.models else os.path.join(ROOT, "docs", "MODELS.md"))
    if md:
        write_markdown(res, a.mode, took, md)
    s = summarize(res)
    s.pop("causal")
    print(json.dumps(s), f"{took:.0f} s")


if __name__ == "__main__":
    main()
