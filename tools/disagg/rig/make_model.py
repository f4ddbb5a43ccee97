"""Make a Llama-style model locally: a trained BPE tokenizer, a chat template and random
float32 weights (nothing comes from a model hub).

Usage: python make_model.py OUTPUT_DIR [--hidden N --layers N --heads N --kv-heads N
--intermediate N --max-positions N] (defaults: the rig's tiny model, the engine tests' one).
Needs torch and transformers, so it runs with the engine venv's Python (``engine.ensure_model``
does that). Deterministic: the same inputs give the same model. The demo and the TTFT benchmark
use a larger one (``bench_model``). A wide ``initializer_range`` keeps greedy output from
collapsing onto one repeated token.

torch, tokenizers and transformers are imported inside the functions that use them: they live
only in the engine venv, and every module of ``disagg`` imports without them.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|begin|>", "<|eot|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "va", "de", "gu", "zi", "on", "el"]


def synthetic_corpus(lines: int = 4000, seed: int = 1234) -> list[str]:
    """Deterministic pseudo-words and punctuation to train the tokenizer on."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(600)]
    corpus = []
    for _ in range(lines):
        sentence = " ".join(rng.choices(words, k=rng.randint(4, 16)))
        corpus.append(sentence.capitalize() + rng.choice([".", "?", "!", ",", ";"]))
    return corpus


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer and wrap it with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(synthetic_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin|>",
        eos_token="<|eot|>",
        chat_template=CHAT_TEMPLATE,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, size: argparse.Namespace) -> LlamaForCausalLM:
    """A Llama of the given size (default 4 layers, 256 wide) with random float32 weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=size.max_positions,
        initializer_range=0.1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    return LlamaForCausalLM(config).to(torch.float32)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--max-positions", type=int, default=4096)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    tokenizer = build_tokenizer()
    build_model(tokenizer, args).save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)


if __name__ == "__main__":
    main()
