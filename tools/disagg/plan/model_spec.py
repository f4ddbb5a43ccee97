"""A model's architecture as the capacity model needs it, read from a Hugging Face config.json.

Only shapes matter here: layers, attention layout (MHA, GQA or MLA, optionally with a
DeepSeek-style sparse indexer), MLP or MoE widths, vocabulary, and the dtypes of the weights
and of the KV cache. Parameter counts are derived from the shapes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4}
_DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp8": "fp8",
    "float8_e4m3fn": "fp8",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp32": "fp32",
}
# DeepSeek-V3.2-style indexer keys are FP8 with one fp32 scale per 128 values (vLLM's
# DeepseekV32IndexerCache: head_dim + head_dim // 128 * 4 bytes per token and layer).
_INDEXER_SCALE_BYTES_PER_128 = 4


class ModelConfigError(ValueError):
    """A model config the capacity model cannot use; the message names the field."""


class AttentionKind(enum.Enum):
    """How a layer stores its KV cache."""

    MHA = "mha"
    GQA = "gqa"
    MLA = "mla"


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts MLP widths (routed experts, shared experts, dense layers)."""

    experts: int
    experts_per_token: int
    shared_experts: int
    expert_intermediate: int
    dense_layers: int


@dataclass(frozen=True)
class SparseIndexer:
    """DeepSeek sparse attention: each query attends to ``top_k`` keys a cheap indexer picks."""

    top_k: int
    heads: int
    head_dim: int


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and dtypes of one model; every size is per full model (before TP sharding)."""

    name: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    weight_dtype: str
    kv_dtype: str
    attention: AttentionKind
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    moe: MoE | None = None
    sparse: SparseIndexer | None = None

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes per KV-cache element."""
        return DTYPE_BYTES[self.kv_dtype]

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        copies = 1 if self.tie_word_embeddings else 2
        return copies * self.vocab_size * self.hidden_size

    def attention_params(self) -> int:
        """Weights of one attention block (projections, and the indexer if sparse)."""
        h, heads = self.hidden_size, self.attention_heads
        if self.attention is not AttentionKind.MLA:
            q_and_o = 2 * h * heads * self.head_dim
            return q_and_o + 2 * h * self.kv_heads * self.head_dim
        qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (
            h * self.q_lora_rank + self.q_lora_rank * heads * qk_dim
            if self.q_lora_rank
            else h * heads * qk_dim
        )
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv += self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        out = heads * self.v_head_dim * h
        indexer = 0
        if self.sparse is not None:
            q_in = self.q_lora_rank or h
            indexer = q_in * self.sparse.heads * self.sparse.head_dim
            indexer += h * self.sparse.head_dim + h * self.sparse.heads
        return q + kv + out + indexer

    def mlp_params(self) -> tuple[int, int]:
        """MLP weights of the whole model: (total, active per token)."""
        dense = 3 * self.hidden_size * self.intermediate_size
        if self.moe is None:
            return self.layers * dense, self.layers * dense
        moe = self.moe
        expert = 3 * self.hidden_size * moe.expert_intermediate
        moe_layers = self.layers - moe.dense_layers
        router = self.hidden_size * moe.experts
        total = moe.dense_layers * dense
        total += moe_layers * ((moe.experts + moe.shared_experts) * expert + router)
        active = moe.dense_layers * dense
        active += moe_layers * ((moe.experts_per_token + moe.shared_experts) * expert + router)
        return total, active

    @property
    def params(self) -> int:
        """Total parameters (embeddings included)."""
        return self.layers * self.attention_params() + self.mlp_params()[0] + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters a token touches (embeddings included; all of them for a dense model)."""
        return self.layers * self.attention_params() + self.mlp_params()[1] + self.embedding_params

    @property
    def matmul_params_per_token(self) -> int:
        """Weights each prompt token multiplies in prefill (no embedding lookup, no LM head).

        vLLM computes logits for the last prompt token only, so the LM head is left out.
        """
        return self.layers * self.attention_params() + self.mlp_params()[1]


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def _int_field(config: Mapping[str, Any], name: str, *aliases: str) -> int:
    for key in (name, *aliases):
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ModelConfigError(f"model config field {key!r} must be a non-negative integer")
            return value
    raise ModelConfigError(
        f"model config lacks {name!r}"
        + (f" (or {', '.join(repr(a) for a in aliases)})" if aliases else "")
        + ": add it to the config JSON"
    )


def _optional_int(config: Mapping[str, Any], *names: str) -> int:
    for name in names:
        if config.get(name) is not None:
            return _int_field(config, name)
    return 0


def parse_dtype(value: object, field: str) -> str:
    """Normalize a dtype name ('bfloat16', 'fp8', ...) or raise naming ``field``."""
    name = _DTYPE_ALIASES.get(str(value).lower())
    if name is None:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise ModelConfigError(f"{field}: unknown dtype {value!r}; use one of {known}")
    return name


def _weight_dtype(config: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    quant = root.get("quantization_config") or config.get("quantization_config")
    if isinstance(quant, Mapping) and str(quant.get("quant_method", "")).lower() == "fp8":
        return "fp8"
    dtype = (
        config.get("torch_dtype") or config.get("dtype") or root.get("torch_dtype") or "bfloat16"
    )
    return parse_dtype(dtype, "torch_dtype")


def _moe(config: Mapping[str, Any]) -> MoE | None:
    experts = _optional_int(config, "n_routed_experts", "num_experts", "num_local_experts")
    if experts == 0:
        return None
    return MoE(
        experts=experts,
        experts_per_token=_int_field(config, "num_experts_per_tok"),
        shared_experts=_optional_int(config, "n_shared_experts"),
        expert_intermediate=_int_field(config, "moe_intermediate_size", "intermediate_size"),
        dense_layers=_optional_int(config, "first_k_dense_replace"),
    )


def spec_from_hf_config(
    config: Mapping[str, Any], name: str, kv_dtype: str | None = None
) -> ModelSpec:
    """Build a ``ModelSpec`` from a Hugging Face ``config.json`` mapping.

    ``kv_dtype`` defaults to the weights' activation dtype (vLLM's ``--kv-cache-dtype auto``):
    bf16 unless the config says float16/float32; FP8 weights still keep a bf16 KV cache.
    """
    text = _text_config(config)
    layers = _int_field(text, "num_hidden_layers", "n_layers")
    hidden = _int_field(text, "hidden_size")
    heads = _int_field(text, "num_attention_heads")
    kv_heads = _optional_int(text, "num_key_value_heads") or heads
    head_dim = _optional_int(text, "head_dim") or hidden // heads
    weight_dtype = _weight_dtype(text, config)
    activation_dtype = "bf16" if weight_dtype == "fp8" else weight_dtype
    kv = parse_dtype(kv_dtype, "kv dtype") if kv_dtype else activation_dtype
    moe = _moe(text)
    intermediate = _int_field(text, "intermediate_size") if moe is None or moe.dense_layers else 0
    common: dict[str, Any] = {
        "name": name,
        "layers": layers,
        "hidden_size": hidden,
        "attention_heads": heads,
        "intermediate_size": intermediate,
        "vocab_size": _int_field(text, "vocab_size"),
        "tie_word_embeddings": bool(text.get("tie_word_embeddings", False)),
        "weight_dtype": weight_dtype,
        "kv_dtype": kv,
        "moe": moe,
    }
    if text.get("kv_lora_rank"):
        sparse = None
        if text.get("index_topk"):
            sparse = SparseIndexer(
                top_k=_int_field(text, "index_topk"),
                heads=_int_field(text, "index_n_heads"),
                head_dim=_int_field(text, "index_head_dim"),
            )
        return ModelSpec(
            **common,
            kv_heads=heads,
            head_dim=head_dim,
            attention=AttentionKind.MLA,
            kv_lora_rank=_int_field(text, "kv_lora_rank"),
            q_lora_rank=_optional_int(text, "q_lora_rank"),
            qk_rope_head_dim=_int_field(text, "qk_rope_head_dim"),
            qk_nope_head_dim=_int_field(text, "qk_nope_head_dim"),
            v_head_dim=_int_field(text, "v_head_dim"),
            sparse=sparse,
        )
    kind = AttentionKind.GQA if kv_heads < heads else AttentionKind.MHA
    return ModelSpec(**common, kv_heads=kv_heads, head_dim=head_dim, attention=kind)


def indexer_bytes_per_token_layer(sparse: SparseIndexer) -> int:
    """Bytes one token's indexer key takes in one layer (FP8 values plus fp32 scales)."""
    return sparse.head_dim + -(-sparse.head_dim // 128) * _INDEXER_SCALE_BYTES_PER_128
