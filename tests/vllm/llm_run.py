"""Runs vLLM's offline `LLM` on `tpu` in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so the
engine's compile counters can be read) and prints one JSON line: outputs and counters.

    python llm_run.py '{"model": DIR, "engine": {...}, "prompts": [[ids], ...],
                        "sampling": [{...}, ...], "rounds": 1}'

`startup_compiles` counts the compiles of the engine's construction. `rounds` > 1 generates the same requests again (a warm engine); counters are per round.
`"sleep": LEVEL` puts the engine to sleep after each round and wakes it before the next (the
engine is then built with enable_sleep_mode); each round reports the bytes allocated on the device
awake and asleep."""

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    spec = json.loads(sys.argv[1])
    import torch
    import torch_tpu
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    engine = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=256,
                  kv_cache_memory_bytes=32 << 20, disable_log_stats=True)
    engine.update(spec.get("engine", {}))
    sleep = spec.get("sleep")
    if sleep:
        engine["enable_sleep_mode"] = True
    start = torch_tpu.metrics.report()["compiles"]
    llm = LLM(model=spec["model"], **engine)
    startup_compiles = torch_tpu.metrics.report()["compiles"] - start
    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    params = [SamplingParams(**s) for s in spec["sampling"]]
    if len(params) == 1:
        params = params * len(prompts)
    rounds = []
    for _ in range(spec.get("rounds", 1)):
        before = torch_tpu.metrics.report()["compiles"]
        outs = llm.generate(prompts, params, use_tqdm=False)
        memory = {}
        if sleep:
            memory["awake"] = torch.tpu.memory_allocated()
            llm.sleep(level=sleep)
            memory["asleep"] = torch.tpu.memory_allocated()
            llm.wake_up()
            if sleep == 2:  # the weights were discarded: load them again
                llm.collective_rpc("reload_weights")
        rounds.append({
            "memory": memory,
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "logprobs": [[{str(k): v.logprob for k, v in step.items()} for step in o.outputs[0].logprobs]
                         if o.outputs[0].logprobs else None for o in outs],
            "compiles": torch_tpu.metrics.report()["compiles"] - before,
        })
    print("RESULT " + json.dumps({"rounds": rounds, "startup_compiles": startup_compiles, "device": llm.llm_engine.vllm_config.device_config.device_type}))


if __name__ == "__main__":
    main()
