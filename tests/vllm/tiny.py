"""Tiny random checkpoints for the vLLM tests, written locally (no network): a HuggingFace config
and weights from `save_pretrained`, and a byte-level BPE tokenizer trained on an inline text."""

import os

CORPUS = """The quick brown fox jumps over the lazy dog. A tiny model serves requests on a device
named tpu. Blocks of sixteen tokens hold the keys and values of every layer. Paged attention
reads them back by block table. Prompts of many lengths arrive, some share a prefix, some are
long enough to be split into chunks. The scheduler preempts a request when the cache is full.
""" * 8


def write_tokenizer(path: str, vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    # a plain chat template, so /v1/chat/completions has one
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}")
    fast.save_pretrained(path)
    return fast


def llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                max_position_embeddings=512, initializer_range=0.1, bos_token_id=1,
                eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32")
    base.update(kw)
    return LlamaConfig(**base)


COMMON = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
              initializer_range=0.1, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def qwen2_config(**kw):
    from transformers import Qwen2Config

    return Qwen2Config(**{**COMMON, **kw})


def qwen3_config(**kw):
    from transformers import Qwen3Config

    return Qwen3Config(**{**COMMON, **kw})


def mistral_config(**kw):
    from transformers import MistralConfig

    # a sliding window shorter than the longer prompts
    return MistralConfig(**{**COMMON, "sliding_window": 32, **kw})


def gemma_config(**kw):
    from transformers import GemmaConfig

    return GemmaConfig(**{**COMMON, "hidden_activation": "gelu_pytorch_tanh", **kw})


def qwen3_moe_config(**kw):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**{**COMMON, "num_experts": 4, "num_experts_per_tok": 2,
                             "moe_intermediate_size": 64, "decoder_sparse_step": 1,
                             "norm_topk_prob": True, **kw})


def write_model(path: str, config, seed: int = 0):
    """Random weights for `config` (any causal-LM config), float32, saved with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    os.makedirs(path, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.save_pretrained(path)
    write_tokenizer(path, config.vocab_size)
    return path
