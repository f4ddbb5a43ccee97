"""Model configs the capacity-model tests share."""

from __future__ import annotations

# Llama-3.1-8B's config.json (the keys the model reads): GQA 32/8 heads, 8.03B parameters.
LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
