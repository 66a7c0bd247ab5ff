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
`--json` prints one line per iteration for tests (reward, compiles, memory, weight checks)."""

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

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


def engine_matches(model, policy):
    """Whether every engine parameter equals the trainer's (bitwise): vLLM keeps q/k/v and
    gate/up stacked, so those are compared against the trainer's concatenated."""
    mine = dict(policy.named_parameters())
    for name, p in model.named_parameters():
        if ".qkv_proj." in name:
            parts = [mine[name.replace("qkv_proj", x)] for x in ("q_proj", "k_proj", "v_proj")]
        elif ".gate_up_proj." in name:
            parts = [mine[name.replace("gate_up_proj", x)] for x in ("gate_proj", "up_proj")]
        else:
            parts = [mine[name]]
        if not torch.equal(p.detach(), torch.cat([x.detach() for x in parts])):
            return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--tokens", type=int, default=8, help="tokens per completion")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sync", choices=["device", "host"], default="device",
                    help="device: the trainer's tensors go to vLLM's loader as they are; host: a state "
                         "dict copied through host memory first (what a trainer in another process does)")
    ap.add_argument("--pattern", default="5,9", help="the token pattern the reward asks for")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="tpu")
    ap.add_argument("--check-weights", action="store_true", help="compare engine and trainer weights each iteration")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pattern = [int(x) for x in args.pattern.split(",")]

    import torch_tpu
    from transformers import LlamaForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tmp = tempfile.mkdtemp(prefix="rl_colocated_")
    tiny_policy(tmp, args.vocab, args.seed, args.hidden, args.layers)
    policy = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32).to(args.device)
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr)
    llm = LLM(model=tmp, skip_tokenizer_init=True, dtype="float32", enforce_eager=True, seed=args.seed,
              max_model_len=64, kv_cache_memory_bytes=8 << 20, enable_sleep_mode=True,
              disable_log_stats=True)

    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, args.vocab, (6,), generator=g).tolist() for _ in range(args.prompts)]
    requests = [TokensPrompt(prompt_token_ids=p) for p in prompts for _ in range(args.group)]
    n = args.tokens

    def peak(fn):
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        out = fn()
        torch.tpu.synchronize()
        return out, torch.tpu.max_memory_allocated()

    for it in range(args.iterations):
        t0 = time.perf_counter()
        c0 = torch_tpu.metrics.report()["compiles"]
        # rollouts: a group of samples per prompt, as many tokens each (fixed shapes for the trainer)
        params = [SamplingParams(temperature=1.0, max_tokens=n, min_tokens=n, ignore_eos=True,
                                 detokenize=False, seed=(args.seed * 1000 + it) * len(requests) + i)
                  for i in range(len(requests))]
        outs, gen_peak = peak(lambda: llm.generate(requests, params, use_tqdm=False))
        completions = [list(o.outputs[0].token_ids) for o in outs]
        rewards = torch.tensor([reward(c, pattern) for c in completions])
        grouped = rewards.view(args.prompts, args.group)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)

        # the engine gives its device memory back while the trainer steps
        llm.sleep(level=2)
        asleep = torch.tpu.memory_allocated()

        def train_step():
            ids = torch.tensor([r["prompt_token_ids"] + c for r, c in zip(requests, completions)],
                               device=args.device)
            logits = policy(ids).logits[:, -n - 1:-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -n:, None]).squeeze(-1)
            loss = -(adv.to(args.device)[:, None] * logp).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.item()

        loss, train_peak = peak(train_step)

        # weights back into the engine: vLLM's loader copies each tensor device to device
        llm.wake_up(tags=["weights"])
        m0 = torch_tpu.metrics.report()
        ts = time.perf_counter()
        with torch.no_grad():
            if args.sync == "device":
                weights = list(policy.named_parameters())
            else:
                weights = [(k, v.to("cpu")) for k, v in policy.state_dict().items()]
            llm.apply_model(lambda model: model.load_weights(weights))
        torch.tpu.synchronize()
        sync_seconds = time.perf_counter() - ts
        m1 = torch_tpu.metrics.report()
        llm.wake_up(tags=["kv_cache"])
        same = llm.apply_model(lambda model: engine_matches(model, policy))[0] if args.check_weights else None
        row = dict(iteration=it, reward=float(rewards.mean()), loss=loss,
                   compiles=torch_tpu.metrics.report()["compiles"] - c0,
                   sync_host_bytes=(m1["h2d_bytes"] - m0["h2d_bytes"]) + (m1["d2h_bytes"] - m0["d2h_bytes"]),
                   generate_peak_bytes=gen_peak, train_peak_bytes=train_peak, asleep_bytes=asleep,
                   allocated_bytes=torch.tpu.memory_allocated(), weights_equal=same, sync_seconds=sync_seconds,
                   seconds=time.perf_counter() - t0)
        if args.json:
            print("ITER " + json.dumps(row), flush=True)
        else:
            print(f"iter {it:3d}  reward {row['reward']:.3f}  loss {loss:+.4f}  compiles {row['compiles']:3d}  "
                  f"peak MiB generate {gen_peak / 2**20:.1f} train {train_peak / 2**20:.1f}  "
                  f"sync {sync_seconds * 1e3:.1f} ms  {row['seconds']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
