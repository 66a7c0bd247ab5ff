"""vLLM on `tpu` (torch_tpu/vllm): the platform plugin resolves, and vLLM's own model code served
offline gives the token ids `transformers` greedy `generate` gives on PyTorch CPU (float32).

Runs in .venv-vllm (scripts/setup_vllm.sh); each engine runs in a subprocess (tests/vllm/llm_run.py).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is installed in .venv-vllm (scripts/setup_vllm.sh)")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny  # noqa: E402

ENV = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false")


def run_llm(model, prompts, sampling, engine=None, rounds=1, timeout=900, sleep=None, env=None):
    spec = dict(model=model, prompts=prompts, sampling=sampling, engine=engine or {}, rounds=rounds, sleep=sleep)
    p = subprocess.run([sys.executable, os.path.join(HERE, "llm_run.py"), json.dumps(spec)],
                       env=dict(ENV, **(env or {})), capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"llm_run failed (rc {p.returncode}):\n{p.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def hf_greedy(model_dir, prompts, n):
    """transformers greedy generate on PyTorch CPU, each prompt alone."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, pad_token_id=0)
            out.append(g[0, len(p):].tolist())
    return out


def check_equal(model_dir, prompts, got, want):
    """Token ids equal; on a mismatch, name the first divergence and HF's top-2 logit gap there
    (a near-tie is numerics, a large gap is a bug)."""
    if got == want:
        return
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for p, g, w in zip(prompts, got, want):
        if g != w:
            i = next(k for k in range(min(len(g), len(w))) if g[k] != w[k]) if g[:len(w)] != w[:len(g)] else min(len(g), len(w))
            with torch.no_grad():
                logits = model(torch.tensor([p + w[:i]])).logits[0, -1]
            top = logits.topk(2).values
            pytest.fail(f"prompt of {len(p)} tokens: vLLM {g} != HF {w} at step {i} "
                        f"(HF top-2 logit gap {float(top[0] - top[1]):.3g})")


PROMPT_LENGTHS = [1, 5, 16, 17, 33, 70]


def prompts_of(lengths, seed=0, vocab=512):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


ARCHS = {
    "llama": lambda: tiny.llama_config(),
    "qwen2": lambda: tiny.qwen2_config(),
    "qwen3": lambda: tiny.qwen3_config(),
    "mistral": lambda: tiny.mistral_config(),
    "gemma": lambda: tiny.gemma_config(),
    "qwen3_moe": lambda: tiny.qwen3_moe_config(),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_models")
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = tiny.write_model(str(root / arch), ARCHS[arch]())
        return cache[arch]

    return get


def test_platform_resolves_to_tpu():
    code = ("from vllm.platforms import current_platform as p; "
            "print(p.device_type, p.device_name, type(p).__module__)")
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["tpu", "tpu", "torch_tpu.vllm.platform"]
    # VLLM_PLUGINS is vLLM's allow-list of plugins: naming another leaves ours unloaded
    env = dict(ENV, VLLM_PLUGINS="some_other_plugin")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "torch_tpu.vllm.platform" not in out.stdout


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_matches_transformers(models, arch):
    model = models(arch)
    prompts = prompts_of(PROMPT_LENGTHS)
    want = hf_greedy(model, prompts, 8)
    res = run_llm(model, prompts, [dict(temperature=0, max_tokens=8, ignore_eos=True)])
    assert res["device"] == "tpu"
    check_equal(model, prompts, res["rounds"][0]["tokens"], want)


def test_batch_chunked_prefill_prefix_and_preemption(models):
    """Prompts across block boundaries, two sharing a 32-token prefix (prefix caching), at most two
    running at once with 32 tokens a step (chunked prefill, queueing), and a KV cache too small for
    all of them (preemption): every output equals the prompt run alone in transformers."""
    model = models("llama")
    shared = prompts_of([32], seed=1)[0]
    prompts = prompts_of([3, 17, 40, 70], seed=2) + [shared + [7, 8, 9], shared + [10, 11]]
    want = hf_greedy(model, prompts, 12)
    engine = dict(max_num_seqs=2, max_num_batched_tokens=32, enable_chunked_prefill=True,
                  enable_prefix_caching=True, num_gpu_blocks_override=12, max_model_len=128)
    res = run_llm(model, prompts, [dict(temperature=0, max_tokens=12, ignore_eos=True)], engine)
    check_equal(model, prompts, res["rounds"][0]["tokens"], want)


def test_compiled_mode_compiles_every_step_shape_at_start_up(models, tmp_path):
    """enforce_eager=False: the program of every step shape is compiled while the engine starts;
    then a mixed load (prompts from 1 to 100 tokens, chunked prefill, decode batches shrinking as
    requests of different lengths finish) compiles nothing and gives transformers' tokens. A second
    engine on the same disk cache compiles nothing at all."""
    model = models("llama")
    prompts = prompts_of([1, 5, 16, 17, 33, 70, 3, 100], seed=4)
    lengths = [3, 12, 7, 20, 1, 9, 15, 5]
    want = [w[:n] for w, n in zip(hf_greedy(model, prompts, max(lengths)), lengths)]
    sampling = [dict(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    engine = dict(enforce_eager=False, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=128,
                  enable_chunked_prefill=True)
    env = dict(TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"))
    cold = run_llm(model, prompts, sampling, engine, rounds=2, env=env)
    assert cold["startup_compiles"] > 0
    assert [r["compiles"] for r in cold["rounds"]] == [0, 0]
    check_equal(model, prompts, cold["rounds"][0]["tokens"], want)
    assert cold["rounds"][1]["tokens"] == cold["rounds"][0]["tokens"]
    warm = run_llm(model, prompts[:3], sampling[:3], engine, env=env)
    assert warm["startup_compiles"] == 0 and warm["rounds"][0]["compiles"] == 0
    assert warm["rounds"][0]["tokens"] == cold["rounds"][0]["tokens"][:3]


def test_seeded_sampling_is_reproducible(models):
    model = models("llama")
    prompts = prompts_of([4, 9, 21], seed=3)
    sampling = [dict(temperature=1.0, top_p=0.9, top_k=50, seed=1234 + i, max_tokens=10, ignore_eos=True,
                     logprobs=2) for i in range(len(prompts))]
    res = run_llm(model, prompts, sampling, rounds=2)
    first, second = res["rounds"]
    assert first["tokens"] == second["tokens"]
    assert all(len(t) == 10 for t in first["tokens"])
    assert first["tokens"] != hf_greedy(model, prompts, 10)  # sampled, not greedy
    # logprobs come back for each step: the sampled token plus the top 2
    assert all(len(lp) == 10 and all(len(step) >= 2 for step in lp) for lp in first["logprobs"])


# ---- `vllm serve` on localhost
def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(port, method, path, body=None, timeout=120):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    import time

    model = models("llama")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w+")
    exe = os.path.join(os.path.dirname(sys.executable), "vllm")
    proc = subprocess.Popen(
        [exe, "serve", model, "--host", "127.0.0.1", "--port", str(port),  # compiled: every step shape at start-up
         "--dtype", "float32", "--max-model-len", "128", "--served-model-name", "tiny",
         "--kv-cache-memory-bytes", str(32 << 20), "--max-num-seqs", "4"],
        env=ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 400
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"vllm serve exited ({proc.returncode}):\n{log.read()[-6000:]}")
            try:
                if _http(port, "GET", "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "vllm serve did not come up in 400 s"
            time.sleep(1)
        yield model, port, log
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _stream(port, body, stop_after=None):
    """POST with stream=true; the token ids of the SSE chunks (or only the first `stop_after`, then the
    connection is dropped, as a client that goes away)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    texts = []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        texts.append(json.loads(line[6:])["choices"][0].get("token_ids") or [])
        if stop_after is not None and len(texts) >= stop_after:
            break
    conn.close()
    return texts


def _metric(port, name, label=""):
    status, text = _http(port, "GET", "/metrics")
    assert status == 200
    total = None
    for line in text.splitlines():
        if line.startswith(name) and label in line:
            total = (total or 0.0) + float(line.split()[-1])
    return total or 0.0


def test_serve_completions_chat_stream_and_errors(server):
    from transformers import AutoTokenizer

    model, port, _ = server
    tok = AutoTokenizer.from_pretrained(model)
    prompts = prompts_of([6, 19], seed=5)
    want = hf_greedy(model, prompts, 8)
    for p, w in zip(prompts, want):
        body = dict(model="tiny", prompt=p, max_tokens=8, temperature=0, ignore_eos=True,
                    return_token_ids=True)
        status, text = _http(port, "POST", "/v1/completions", body)
        assert status == 200, text
        choice = json.loads(text)["choices"][0]
        assert choice["token_ids"] == w
        # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 sequence
        assert tok.decode(w).startswith(choice["text"])
        assert sum(_stream(port, body), []) == w

    status, text = _http(port, "POST", "/v1/chat/completions",
                         dict(model="tiny", messages=[{"role": "user", "content": "the quick fox"}],
                              max_tokens=5, temperature=0))
    assert status == 200, text
    reply = json.loads(text)
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["completion_tokens"] <= 5

    # vLLM's own HTTP errors, and the server keeps serving
    too_long = dict(model="tiny", prompt=list(range(3, 200)), max_tokens=4)
    assert _http(port, "POST", "/v1/completions", too_long)[0] == 400
    assert _http(port, "POST", "/v1/completions", dict(model="nope", prompt="a", max_tokens=2))[0] == 404
    assert _http(port, "POST", "/v1/completions", dict(model="tiny", prompt="a", temperature=-1))[0] == 400
    assert _http(port, "POST", "/v1/completions", dict(model="tiny", prompt=prompts[0], max_tokens=2))[0] == 200


def test_serve_client_disconnect_frees_the_request(server):
    import time

    _, port, _ = server
    long = dict(model="tiny", prompt=prompts_of([10], seed=6)[0], max_tokens=100, temperature=0,
                ignore_eos=True, return_token_ids=True)
    generated = _metric(port, "vllm:generation_tokens_total")
    assert len(_stream(port, long, stop_after=2)) == 2  # read two chunks, then hang up
    deadline = time.time() + 60
    while _metric(port, "vllm:num_requests_running") > 0:
        assert time.time() < deadline, "the abandoned request is still running"
        time.sleep(0.5)
    # it was aborted (its blocks freed), not run to its 100 tokens
    assert _metric(port, "vllm:generation_tokens_total") - generated < 100
    assert _metric(port, "vllm:kv_cache_usage_perc") == 0.0
    assert _http(port, "POST", "/v1/completions", dict(model="tiny", prompt="fox", max_tokens=3))[0] == 200


def test_serve_concurrent_streams_some_disconnecting(server):
    """A small load run: 10 concurrent streaming clients, 3 of which hang up after two chunks.
    Every other request completes with transformers' greedy tokens, the server stays healthy, no
    request or KV block is left behind, and no step compiled."""
    import threading
    import time

    model, port, log = server
    prompts = prompts_of([5, 9, 14, 20, 27, 33, 41, 8, 12, 17], seed=7)
    want = hf_greedy(model, prompts, 10)
    results, errors = {}, []

    def client(i):
        try:
            body = dict(model="tiny", prompt=prompts[i], max_tokens=10, temperature=0,
                        ignore_eos=True, return_token_ids=True)
            results[i] = sum(_stream(port, body, stop_after=2 if i % 4 == 3 else None), [])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    full = [i for i in range(len(prompts)) if i % 4 != 3]
    check_equal(model, [prompts[i] for i in full], [results[i] for i in full], [want[i] for i in full])
    assert all(len(results[i]) >= 1 for i in range(len(prompts)) if i % 4 == 3)
    deadline = time.time() + 60
    while _metric(port, "vllm:num_requests_running") > 0 or _metric(port, "vllm:num_requests_waiting") > 0:
        assert time.time() < deadline, "requests left running after every client finished"
        time.sleep(0.5)
    assert _metric(port, "vllm:kv_cache_usage_perc") == 0.0
    assert _http(port, "GET", "/health")[0] == 200
    # the step programs were compiled at start-up, and no step of this load compiled one
    with open(log.name) as f:  # a reader of its own: the server's writes share `log`'s offset
        text = f.read()
    assert "step programs in" in text
    assert "compiled while serving" not in text
