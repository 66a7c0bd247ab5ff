"""GRPO-style reinforcement learning with the trainer and the rollout engine on one `tpu` device,
in one process: a torch policy (transformers' Llama) trains on `tpu` while vLLM's offline `LLM`
generates its rollouts on the same device.

Each iteration: vLLM samples a group of completions per prompt; a verifiable reward scores them
(the share of tokens that follow a fixed token pattern); the policy takes a policy-gradient step on
the group-normalised advantages; the engine sleeps through the step (its KV cache and its weights
are given back: `LLM.sleep(level=2)`) and wakes with the trainer's new weights, copied device to
device by vLLM's own loader (`LLM.apply_model(lambda m: m.load_weights(...))`, no host round trip).

    python examples/rl_colocated.py --iterations 30

Needs vLLM (scripts/setup_vllm.sh: `.venv-vllm/bin/python examples/rl_colocated.py`). The engine
runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), as RL frameworks run it colocated.
`--json` prints one line per iteration for tests (reward, compiles, memory, weight checks).

    python examples/rl_colocated.py --processes 2

runs the trainer and the rollout engine in two processes on one device, as two Ray actors would:
both attach to a device owner (`python -m torch_tpu.owner`, started here unless TORCH_TPU_OWNER
names one), the device's only process under the one-process rule. Each iteration the trainer
shares its parameters by handle (`torch_tpu.owner.share`), the rollout process opens them (the
same device memory: no copy, no byte through host memory or a third process) and vLLM's loader
copies them into the engine's parameters on the device."""

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")



def _attach_to_an_owner():
    """--processes 2 (the launcher, which becomes the trainer): before torch starts, attach this
    process to a device owner, starting one unless TORCH_TPU_OWNER names a running one."""
    argv = sys.argv[1:]
    if "--processes" not in argv or "--role" in argv:
        return None
    if argv[argv.index("--processes") + 1] != "2":
        return None
    if os.environ.get("TORCH_TPU_OWNER"):
        return None
    d = tempfile.mkdtemp(prefix="rl_owner_")
    sock, log = os.path.join(d, "owner.sock"), os.path.join(d, "owner.log")
    with open(log, "w") as f:
        owner = subprocess.Popen([sys.executable, "-m", "torch_tpu.owner", "--socket", sock],
                                 stdout=subprocess.DEVNULL, stderr=f)
    deadline = time.time() + 120
    while "serves" not in open(log).read():
        if owner.poll() is not None or time.time() > deadline:
            raise SystemExit(f"rl_colocated: the device owner did not start:\n{open(log).read()[-2000:]}")
        time.sleep(0.05)
    os.environ["TORCH_TPU_OWNER"] = sock
    return owner


OWNER = _attach_to_an_owner()

import torch  # noqa: E402


def tiny_policy(path, vocab, seed, hidden=64, layers=2):
    """A random Llama written with save_pretrained (vLLM loads it from `path`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=128, initializer_range=0.05, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32")
    LlamaForCausalLM(cfg).save_pretrained(path)


def reward(tokens, pattern):
    """The share of completion tokens equal to pattern[i % len(pattern)]."""
    hits = sum(t == pattern[i % len(pattern)] for i, t in enumerate(tokens))
    return hits / len(tokens)


def engine_matches(model, mine):
    """Whether every engine parameter equals the trainer's `mine` {name: tensor} (bitwise): vLLM
    keeps q/k/v and gate/up stacked, so those are compared against the trainer's concatenated."""
    for name, p in model.named_parameters():
        if ".qkv_proj." in name:
            parts = [mine[name.replace("qkv_proj", x)] for x in ("q_proj", "k_proj", "v_proj")]
        elif ".gate_up_proj." in name:
            parts = [mine[name.replace("gate_up_proj", x)] for x in ("gate_proj", "up_proj")]
        else:
            parts = [mine[name]]
        if not torch.equal(p.detach().cpu(), torch.cat([x.detach().cpu() for x in parts])):
            return False
    return True


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--tokens", type=int, default=8, help="tokens per completion")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sync", choices=["device", "host"], default="device",
                    help="device: the trainer's tensors go to vLLM's loader as they are (or, with "
                         "--processes 2, by handle); host: a state dict copied through host memory first")
    ap.add_argument("--processes", type=int, choices=[1, 2], default=1,
                    help="2: the rollout engine in a second process, both attached to a device owner")
    ap.add_argument("--role", choices=["rollout"], help=argparse.SUPPRESS)  # the second process
    ap.add_argument("--conn", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--pattern", default="5,9", help="the token pattern the reward asks for")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="tpu")
    ap.add_argument("--check-weights", action="store_true", help="compare engine and trainer weights each iteration")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args()


def peak(fn):
    """fn's result and the peak device memory this process allocated while it ran."""
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    out = fn()
    torch.tpu.synchronize()
    return out, torch.tpu.max_memory_allocated()


class Rollouts:
    """vLLM's offline engine and what an RL loop asks of it: sample, sleep, take weights, wake."""

    def __init__(self, args, path):
        from vllm import LLM

        self.args = args
        self.llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", enforce_eager=True, seed=args.seed,
                       max_model_len=64, kv_cache_memory_bytes=8 << 20, enable_sleep_mode=True,
                       disable_log_stats=True)

    def generate(self, it, requests):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        n, a = self.args.tokens, self.args
        # a group of samples per prompt, as many tokens each (fixed shapes for the trainer)
        params = [SamplingParams(temperature=1.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False,
                                 seed=(a.seed * 1000 + it) * len(requests) + i) for i in range(len(requests))]
        prompts = [TokensPrompt(prompt_token_ids=p) for p in requests]
        outs, gen_peak = peak(lambda: self.llm.generate(prompts, params, use_tqdm=False))
        return [list(o.outputs[0].token_ids) for o in outs], gen_peak

    def compiles(self):
        return 0  # counted with the trainer's: one process

    def sleep(self):
        """The engine gives its device memory (KV cache and weights) back while the trainer steps."""
        self.llm.sleep(level=2)
        return torch.tpu.memory_allocated()

    def load(self, weights, check):
        """Wakes with `weights` [(name, tensor)] copied into the engine's parameters by vLLM's own
        loader (device to device); returns (seconds, host bytes moved, engine == weights)."""
        import torch_tpu

        self.llm.wake_up(tags=["weights"])
        m0 = torch_tpu.metrics.report()
        ts = time.perf_counter()
        with torch.no_grad():
            self.llm.apply_model(lambda model: model.load_weights(weights))
        torch.tpu.synchronize()
        seconds = time.perf_counter() - ts
        m1 = torch_tpu.metrics.report()
        self.llm.wake_up(tags=["kv_cache"])
        same = self.llm.apply_model(lambda model: engine_matches(model, dict(weights)))[0] if check else None
        return seconds, (m1["h2d_bytes"] - m0["h2d_bytes"]) + (m1["d2h_bytes"] - m0["d2h_bytes"]), same


class RemoteRollouts:
    """The same, in the rollout process (`--role rollout`); the trainer's weights go there by handle."""

    def __init__(self, args, path):
        import socket
        from multiprocessing.connection import Connection

        mine, theirs = socket.socketpair()
        argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--role", "rollout",
                "--conn", str(theirs.fileno()), "--model", path]
        self.proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()])
        theirs.close()
        self.conn = Connection(mine.detach())
        self.args = args

    def _call(self, *msg):
        # plain pickle: a host tensor travels as its bytes (multiprocessing's own pickler would
        # pass it as a shared-memory file descriptor)
        self.conn.send_bytes(pickle.dumps(msg))
        reply = pickle.loads(self.conn.recv_bytes())
        if isinstance(reply, BaseException):
            raise RuntimeError("the rollout process failed") from reply
        return reply

    def generate(self, it, requests):
        return self._call("generate", it, requests)

    def sleep(self):
        return self._call("sleep")

    def load(self, weights, check):
        import torch_tpu
        import torch_tpu.owner

        m0, t0 = torch_tpu.metrics.report(), time.perf_counter()
        if self.args.sync == "host":  # a state dict through host memory, then to the other process
            shared = list(weights)
        else:
            shared = [(k, torch_tpu.owner.share(v)) for k, v in weights]
        m1, t1 = torch_tpu.metrics.report(), time.perf_counter()
        seconds, host_bytes, same = self._call("load", shared, check)
        host_bytes += (m1["h2d_bytes"] - m0["h2d_bytes"]) + (m1["d2h_bytes"] - m0["d2h_bytes"])
        return seconds + (t1 - t0), host_bytes, same

    def compiles(self):
        return self._call("compiles")

    def close(self):
        try:
            self.conn.send_bytes(pickle.dumps(("exit",)))
        except OSError:
            pass  # the rollout process is gone already
        self.proc.wait(120)


def rollout_process(args):
    """--role rollout: serves the trainer's requests with a Rollouts engine of its own."""
    from multiprocessing.connection import Connection

    conn = Connection(args.conn)
    engine = Rollouts(args, args.model)
    def send(obj):
        conn.send_bytes(pickle.dumps(obj))

    while True:
        msg = pickle.loads(conn.recv_bytes())
        try:
            if msg[0] == "exit":
                return
            if msg[0] == "generate":
                send(engine.generate(*msg[1:]))
            elif msg[0] == "sleep":
                send(engine.sleep())
            elif msg[0] == "compiles":
                import torch_tpu

                send(torch_tpu.metrics.report()["compiles"])
            elif msg[0] == "load":
                import torch_tpu

                _, shared, check = msg
                m0, t0 = torch_tpu.metrics.report(), time.perf_counter()
                # a handle opens the trainer's device memory; a host tensor is copied to the device
                weights = [(k, v.open() if hasattr(v, "open") else v.to("tpu")) for k, v in shared]
                m1, t1 = torch_tpu.metrics.report(), time.perf_counter()
                seconds, host_bytes, same = engine.load(weights, check)
                del weights  # the trainer's buffers are the trainer's again
                host_bytes += (m1["h2d_bytes"] - m0["h2d_bytes"]) + (m1["d2h_bytes"] - m0["d2h_bytes"])
                send((seconds + (t1 - t0), host_bytes, same))
        except Exception as e:  # reported in the trainer
            send(e)
            raise


def main():
    args = parse_args()
    if args.role == "rollout":
        return rollout_process(args)
    pattern = [int(x) for x in args.pattern.split(",")]

    import torch_tpu
    from transformers import LlamaForCausalLM

    tmp = tempfile.mkdtemp(prefix="rl_colocated_")
    tiny_policy(tmp, args.vocab, args.seed, args.hidden, args.layers)
    policy = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32).to(args.device)
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    engine = (RemoteRollouts if args.processes == 2 else Rollouts)(args, tmp)

    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, args.vocab, (6,), generator=g).tolist() for _ in range(args.prompts)]
    requests = [p for p in prompts for _ in range(args.group)]
    n = args.tokens

    try:
        for it in range(args.iterations):
            t0 = time.perf_counter()
            c0 = torch_tpu.metrics.report()["compiles"] + engine.compiles()
            completions, gen_peak = engine.generate(it, requests)
            rewards = torch.tensor([reward(c, pattern) for c in completions])
            grouped = rewards.view(args.prompts, args.group)
            adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)

            asleep = engine.sleep()

            def train_step():
                ids = torch.tensor([r + c for r, c in zip(requests, completions)], device=args.device)
                logits = policy(ids).logits[:, -n - 1:-1].float()
                logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -n:, None]).squeeze(-1)
                loss = -(adv.to(args.device)[:, None] * logp).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                return loss.item()

            loss, train_peak = peak(train_step)

            # weights back into the engine, device to device (--sync host: through host memory)
            m0, ts = torch_tpu.metrics.report(), time.perf_counter()
            with torch.no_grad():
                if args.sync == "device":
                    weights = [(k, v.detach()) for k, v in policy.named_parameters()]
                else:
                    weights = [(k, v.to("cpu")) for k, v in policy.state_dict().items()]
            m1, copy_seconds = torch_tpu.metrics.report(), time.perf_counter() - ts
            sync_seconds, sync_bytes, same = engine.load(weights, args.check_weights)
            sync_seconds += copy_seconds
            sync_bytes += (m1["h2d_bytes"] - m0["h2d_bytes"]) + (m1["d2h_bytes"] - m0["d2h_bytes"])
            del weights
            row = dict(iteration=it, reward=float(rewards.mean()), loss=loss,
                       compiles=torch_tpu.metrics.report()["compiles"] + engine.compiles() - c0,
                       sync_host_bytes=sync_bytes,
                       generate_peak_bytes=gen_peak, train_peak_bytes=train_peak, asleep_bytes=asleep,
                       allocated_bytes=torch.tpu.memory_allocated(), weights_equal=same, sync_seconds=sync_seconds,
                       seconds=time.perf_counter() - t0, processes=args.processes)
            if args.json:
                print("ITER " + json.dumps(row), flush=True)
            else:
                print(f"iter {it:3d}  reward {row['reward']:.3f}  loss {loss:+.4f}  compiles {row['compiles']:3d}  "
                      f"peak MiB generate {gen_peak / 2**20:.1f} train {train_peak / 2**20:.1f}  "
                      f"sync {sync_seconds * 1e3:.1f} ms  {row['seconds']:.2f} s", flush=True)
    finally:
        try:
            if isinstance(engine, RemoteRollouts):
                engine.close()
        finally:
            if OWNER is not None:
                OWNER.terminate()
                OWNER.wait(60)


if __name__ == "__main__":
    main()
