#!/usr/bin/env python3
"""Local stand-ins for the test assets TorchTitan's Llama 3 debug model reads.

TorchTitan's `debugmodel` flavor trains on the `c4_test` dataset with the tokenizer from
`tests/assets/tokenizer`; both live in TorchTitan's source repository, not in its wheel, and
a machine without network cannot download them. This script writes equivalents, with no
network and only `tokenizers` (a TorchTitan dependency):

    OUT/tokenizer/tokenizer.json, tokenizer_config.json   a byte-level BPE tokenizer, vocab <= 2048
                                                          (the debug model's vocab_size)
    OUT/c4_test/data.json                                 JSON lines with a "text" field, as c4

Train with them (recipe in README "TorchTitan"):

    python examples/torchtitan/prepare_assets.py /tmp/titan_assets
    torchrun --nproc_per_node=2 -m torchtitan.train --model.name llama3 --model.flavor debugmodel \\
        --model.hf-assets-path /tmp/titan_assets/tokenizer \\
        --training.dataset-path /tmp/titan_assets/c4_test --training.seq-len 128 \\
        --parallelism.data-parallel-shard-degree 2

The text is synthetic (words drawn with Zipf-like frequencies), deterministic for a given
--seed, so the loss falls the way it does on c4_test.
"""
import argparse
import json
import os
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
SYLLABLES = ("ka lo mi ne ta ri so pu ve da gi ho ba ze ku fa ni to re sa li mo che ton").split()
FUNCTION_WORDS = ("the a of and to in is it that was for on with as this by at from we you").split()


def make_documents(count, seed):
    rng = random.Random(seed)
    words = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(3000)})
    weights = [1.0 / (rank + 1) for rank in range(len(words))]

    def sentence():
        picked = [rng.choice(FUNCTION_WORDS) if rng.random() < 0.35 else rng.choices(words, weights)[0]
                  for _ in range(rng.randint(5, 18))]
        text = " ".join(picked)
        return text[0].upper() + text[1:] + rng.choice("...?!")

    return [" ".join(sentence() for _ in range(rng.randint(3, 30))) for _ in range(count)]


def write_dataset(docs, directory):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "data.json")
    with open(path, "w") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z",
                                "url": f"https://example.invalid/{i}"}) + "\n")
    return path


def write_tokenizer(docs, directory, vocab_size):
    os.makedirs(directory, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(docs, trainer=trainer)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    special = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    config = {
        "bos_token": BOS, "eos_token": EOS,
        # TorchTitan adds BOS/EOS itself
        "add_bos_token": False, "add_eos_token": False,
        "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(tokenizer.token_to_id(t)): dict(special, content=t) for t in (BOS, EOS)},
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return tokenizer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to write tokenizer/ and c4_test/ into")
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--vocab-size", type=int, default=2000, help="at most 2048 (the debug model's vocab)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    if not 258 <= args.vocab_size <= 2048:
        parser.error("--vocab-size must be in [258, 2048]: 256 byte symbols and BOS/EOS, and the debug "
                     "model's embedding has 2048 rows")
    docs = make_documents(args.documents, args.seed)
    data = write_dataset(docs, os.path.join(args.out, "c4_test"))
    tokenizer = write_tokenizer(docs, os.path.join(args.out, "tokenizer"), args.vocab_size)
    print(f"tokenizer: {os.path.join(args.out, 'tokenizer')} (vocab {tokenizer.get_vocab_size()})")
    print(f"dataset:   {data} ({len(docs)} documents)")
    print(f"flags:     --model.hf-assets-path {os.path.join(args.out, 'tokenizer')} "
          f"--training.dataset-path {os.path.join(args.out, 'c4_test')}")


if __name__ == "__main__":
    main()
