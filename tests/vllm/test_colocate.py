"""RL colocation (issue 27): a trainer and vLLM's rollout engine on one `tpu` device, in one
process or in two attached to a device owner. The engine sleeps (gives its KV cache and weights back) while the trainer steps and wakes
with the trainer's weights, copied device to device by vLLM's loader.

Runs in .venv-vllm (scripts/setup_vllm.sh); the engines run in subprocesses."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is installed in .venv-vllm (scripts/setup_vllm.sh)")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from test_vllm import ENV, hf_greedy, models, prompts_of, run_llm  # noqa: E402,F401  (models: a fixture)


def run_example(*args, timeout=900, env=None):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "rl_colocated.py"), "--json", *args],
                       env=dict(ENV, **(env or {})), capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(ln[len("ITER "):]) for ln in p.stdout.splitlines() if ln.startswith("ITER ")]
    assert p.returncode == 0 and rows, f"rl_colocated failed (rc {p.returncode}):\n{p.stderr[-6000:]}"
    return rows


def check_loop(rows):
    """Weights equal after every sync, no host bytes, no compile after the third iteration, memory
    flat, the reward rises; returns the steady rows."""
    assert all(r["weights_equal"] for r in rows), [r["iteration"] for r in rows if not r["weights_equal"]]
    assert all(r["sync_host_bytes"] == 0 for r in rows), [r["sync_host_bytes"] for r in rows]
    steady = rows[3:]
    assert [r["compiles"] for r in steady] == [0] * len(steady), [r["compiles"] for r in rows]
    assert len({r["allocated_bytes"] for r in steady}) == 1, [r["allocated_bytes"] for r in rows]
    assert len({r["asleep_bytes"] for r in steady}) == 1, [r["asleep_bytes"] for r in rows]
    first = sum(r["reward"] for r in rows[:5]) / 5
    last = sum(r["reward"] for r in rows[-5:]) / 5
    assert last > first + 0.2, (first, last)
    return steady


def test_grpo_loop_colocated_in_one_process():
    """50 iterations: the engine's weights equal the trainer's bitwise after every sync, the sync
    moves no byte through host memory, steady iterations compile nothing, device memory stays flat
    and the reward rises."""
    rows = run_example("--iterations", "50", "--check-weights")
    assert len(rows) == 50
    steady = check_loop(rows)
    # asleep, the device holds the trainer's state only: less than while generating
    assert all(r["asleep_bytes"] < r["generate_peak_bytes"] for r in steady)


def test_grpo_loop_in_two_processes_attached_to_one_owner(tmp_path):
    """--processes 2 under the one-process rule (TORCH_TPU_EXCLUSIVE=1): the trainer and the
    rollout engine are two processes attached to a device owner, the device's only process. The
    trainer's weights reach the engine by handle: equal bitwise after every sync, no byte through
    host memory, no compile in steady iterations, memory flat, the reward rises."""
    rows = run_example("--iterations", "50", "--check-weights", "--processes", "2",
                       env=dict(TORCH_TPU_EXCLUSIVE="1", XDG_RUNTIME_DIR=str(tmp_path)))
    assert len(rows) == 50 and all(r["processes"] == 2 for r in rows)
    check_loop(rows)


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_the_device_and_wakes_with_the_same_weights(models, level):
    """LLM.sleep(level=1) moves the weights to host memory and drops the KV cache, level 2 drops
    both (the weights are loaded again with collective_rpc("reload_weights")); after
    LLM.wake_up() greedy generation gives the tokens it gave before, equal to transformers'."""
    model = models("llama")
    prompts = prompts_of([5, 19], seed=7)
    want = hf_greedy(model, prompts, 6)
    res = run_llm(model, prompts, [dict(temperature=0, max_tokens=6, ignore_eos=True)], rounds=2,
                  engine=dict(kv_cache_memory_bytes=32 << 20), sleep=level)
    for r in res["rounds"]:
        assert r["tokens"] == want
        # the KV cache (32 MiB) and the weights are given back while asleep
        assert r["memory"]["awake"] - r["memory"]["asleep"] >= 32 << 20, r["memory"]
