"""Work counts of prefill and KV transfer, and how three efficiency constants turn them into time.

Every duration the model predicts is ``steps * fixed_overhead + flops / (compute_efficiency *
peak) + bytes / (link_efficiency * link)``: a ``Cost`` keeps the three terms apart, at peak,
so calibration can fit the constants and reports can show the physical floor.
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg.plan.model_spec import (
    DTYPE_BYTES,
    AttentionKind,
    ModelSpec,
    indexer_bytes_per_token_layer,
)


@dataclass(frozen=True)
class Efficiency:
    """The model's only fitted constants, shared by every model, GPU and fabric."""

    compute: float
    link: float
    fixed_overhead_s: float

    def __post_init__(self) -> None:
        for name, value in (("compute", self.compute), ("link", self.link)):
            if not 0 < value <= 1:
                raise ValueError(f"{name} efficiency must be in (0, 1], got {value}")
        if self.fixed_overhead_s < 0:
            raise ValueError(f"fixed overhead must be >= 0 s, got {self.fixed_overhead_s}")


@dataclass(frozen=True)
class Cost:
    """A duration split into serialized steps, compute seconds at peak and link seconds at peak."""

    steps: int = 0
    compute_s: float = 0.0
    link_s: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.steps + other.steps, self.compute_s + other.compute_s, self.link_s + other.link_s
        )

    def seconds(self, eff: Efficiency) -> float:
        """Predicted duration under ``eff``."""
        return (
            self.steps * eff.fixed_overhead_s
            + self.compute_s / eff.compute
            + self.link_s / eff.link
        )

    @property
    def floor_s(self) -> float:
        """The physical floor: every unit at its peak, no fixed overhead."""
        return self.compute_s + self.link_s


def _causal_pairs(context: int, new: int) -> int:
    """Query-key pairs when ``new`` tokens attend causally after ``context`` cached ones."""
    return new * context + new * (new + 1) // 2


def _capped_pairs(context: int, new: int, cap: int) -> int:
    """Like ``_causal_pairs`` but each query sees at most ``cap`` keys (sparse attention)."""

    def upto(n: int) -> int:
        if n <= cap:
            return n * (n + 1) // 2
        return cap * (cap + 1) // 2 + (n - cap) * cap

    return upto(context + new) - upto(context)


def attention_flops(spec: ModelSpec, context: int, new: int) -> float:
    """FLOPs of attention itself (scores and weighted values) for ``new`` tokens after ``context``.

    MHA/GQA: 4 * heads * head_dim per query-key pair and layer. MLA without a sparse indexer
    runs decompressed (vLLM's prefill path): per pair 2 * heads * (qk_nope + qk_rope + v), plus
    up-projecting the cached context latent once. Sparse MLA (DeepSeek sparse attention) runs
    in the latent: each query meets at most ``top_k`` keys of width kv_lora_rank + qk_rope and
    values of width kv_lora_rank, and the indexer scores every causal pair.
    """
    heads = spec.attention_heads
    if spec.attention is not AttentionKind.MLA:
        per_pair = 4 * heads * spec.head_dim
        return float(spec.layers * per_pair * _causal_pairs(context, new))
    if spec.sparse is None:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        per_pair = 2 * heads * (qk + spec.v_head_dim)
        up_projection = (
            2 * context * spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        )
        return float(spec.layers * (per_pair * _causal_pairs(context, new) + up_projection))
    latent = spec.kv_lora_rank
    per_pair = 2 * heads * (latent + spec.qk_rope_head_dim) + 2 * heads * latent
    main = per_pair * _capped_pairs(context, new, spec.sparse.top_k)
    indexer = 2 * spec.sparse.heads * spec.sparse.head_dim * _causal_pairs(context, new)
    return float(spec.layers * (main + indexer))


def prefill_flops(spec: ModelSpec, context: int, new: int) -> float:
    """FLOPs to prefill ``new`` tokens attending to ``context`` cached tokens plus themselves."""
    linear = 2.0 * spec.matmul_params_per_token * new
    return linear + attention_flops(spec, context, new)


def weight_bytes_streamed(spec: ModelSpec, tokens: int) -> float:
    """Weight bytes a forward pass over ``tokens`` tokens reads from HBM (all ranks together).

    Attention, dense MLP, shared-expert and router weights are read once per pass; a routed
    expert only if a token picked it: expected fraction ``1 - (1 - top_k / experts)**tokens``.
    """
    dtype_bytes = DTYPE_BYTES[spec.weight_dtype]
    always = spec.layers * spec.attention_params()
    moe = spec.moe
    if moe is None:
        return float(dtype_bytes * (always + spec.mlp_params()[0]))
    expert = 3 * spec.hidden_size * moe.expert_intermediate
    moe_layers = spec.layers - moe.dense_layers
    dense_mlp = moe.dense_layers * 3 * spec.hidden_size * spec.intermediate_size
    shared = moe_layers * (moe.shared_experts * expert + spec.hidden_size * moe.experts)
    touched = 1 - (1 - moe.experts_per_token / moe.experts) ** tokens
    routed = moe_layers * moe.experts * expert * touched
    return dtype_bytes * (always + dense_mlp + shared + routed)


def kv_bytes_per_token_per_gpu(spec: ModelSpec, tp: int) -> int:
    """KV-cache bytes one token occupies on each of the ``tp`` GPUs (what each one reads).

    GQA/MHA shard KV heads across ranks (replicated when there are fewer heads than ranks);
    MLA keeps the whole latent on every rank, and a sparse indexer adds its FP8 keys.
    """
    if spec.attention is not AttentionKind.MLA:
        heads_per_gpu = -(-spec.kv_heads // tp)
        return spec.layers * 2 * heads_per_gpu * spec.head_dim * spec.kv_dtype_bytes
    per_layer = (spec.kv_lora_rank + spec.qk_rope_head_dim) * spec.kv_dtype_bytes
    if spec.sparse is not None:
        per_layer += indexer_bytes_per_token_layer(spec.sparse)
    return spec.layers * per_layer
