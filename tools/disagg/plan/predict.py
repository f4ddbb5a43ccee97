"""TTFT with KV reuse off and on, KV transfer time, and the recompute threshold for a deployment.

One conversation turn of ``prompt`` tokens, of which the last ``suffix`` are new this turn:

* Prefill runs in passes of at most ``max_batched_tokens`` tokens; each pass costs its FLOPs
  at peak or its HBM traffic (weights streamed, KV attended) at peak, whichever is longer,
  plus its two activation all-reduces per layer over NVLink.
* OFF (full recompute, prefill cache evicted): ``prefill_off = step + C(0, prompt)``.
* ON: prefill READs the reused prefix from decode (``kv_read = step + bytes/link``), then
  computes the suffix attending to the whole context: ``prefill_on = step + kv_read +
  C(reused, prompt - reused)``. Reuse covers whole KV blocks only, so the partial last block
  of the prefix is recomputed with the suffix.
* Both legs then hand the new suffix's KV to decode (``step + bytes/link``; decode keeps the
  earlier turns' blocks) before the first token: ``ttft = prefill + handoff``.

``C(context, new)`` is that roofline time over the TP group; ``step`` is one fixed overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from disagg.plan.catalog import Fabric, Gpu
from disagg.plan.model_spec import AttentionKind, ModelSpec
from disagg.plan.physics import (
    Cost,
    Efficiency,
    kv_bytes_per_token_per_gpu,
    prefill_flops,
    weight_bytes_streamed,
)

# New tokens per turn in vLLM's multi-turn benchmark config (benchmarks/multi_turn/
# generate_multi_turn.json: user turns uniform 120..160 tokens). The seed does not publish
# its own sweep config; `disagg plan --suffix-tokens` overrides this.
DEFAULT_SUFFIX_TOKENS = 140
# vLLM's KV block sizes: 16 on CUDA by default; FlashMLA (MLA models) needs 64.
DEFAULT_BLOCK_TOKENS = 16
MLA_BLOCK_TOKENS = 64
# vLLM's default --max-num-batched-tokens for the OpenAI server on GPUs of 70 GiB and more
# (EngineArgs defaults: H100/H200 8192): a prefill runs in passes of at most this many tokens.
DEFAULT_MAX_BATCHED_TOKENS = 8192
# Activations cross the TP all-reduces in bf16.
ACTIVATION_BYTES = 2
# Search cap for the recompute threshold: past this, reuse never beats recompute.
_THRESHOLD_CAP_TOKENS = 1 << 24


@dataclass(frozen=True)
class Deployment:
    """A model served with tensor parallelism ``tp`` on ``gpu`` nodes joined by ``fabric``."""

    model: ModelSpec
    gpu: Gpu
    tp: int
    fabric: Fabric
    suffix_tokens: int = DEFAULT_SUFFIX_TOKENS
    block_tokens: int = 0
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {self.tp}")
        if self.suffix_tokens < 1:
            raise ValueError(f"--suffix-tokens must be >= 1, got {self.suffix_tokens}")
        if self.block_tokens < 0:
            raise ValueError(f"--block-size must be >= 1, got {self.block_tokens}")
        if self.max_batched_tokens < 1:
            raise ValueError(f"--max-batched-tokens must be >= 1, got {self.max_batched_tokens}")

    @property
    def block(self) -> int:
        """KV block size in tokens (explicit, else vLLM's default for the attention kind)."""
        if self.block_tokens:
            return self.block_tokens
        return (
            MLA_BLOCK_TOKENS if self.model.attention is AttentionKind.MLA else DEFAULT_BLOCK_TOKENS
        )

    @property
    def peak_flops(self) -> float:
        """Peak dense FLOP/s of the TP group for the model's weight dtype."""
        return self.tp * self.gpu.peak_for(self.model.weight_dtype)

    def compute(self, context: int, new: int) -> Cost:
        """Prefill of ``new`` tokens after ``context`` cached ones, in seconds at the roofline.

        vLLM runs it in passes of at most ``max_batched_tokens``; each pass takes the longer of
        its FLOPs at peak and its HBM traffic (weights, plus the KV it attends to) at peak, then
        its tensor-parallel all-reduces over NVLink (vLLM does not overlap them).
        """
        seconds = 0.0
        done = 0
        while done < new:
            chunk = min(self.max_batched_tokens, new - done)
            start = context + done
            flops_s = prefill_flops(self.model, start, chunk) / self.peak_flops
            hbm_bytes = weight_bytes_streamed(self.model, chunk) / self.tp
            hbm_bytes += (start + chunk) * kv_bytes_per_token_per_gpu(self.model, self.tp)
            seconds += max(flops_s, hbm_bytes / self.gpu.hbm_bytes_per_s)
            seconds += self.all_reduce_s(chunk)
            done += chunk
        return Cost(compute_s=seconds)

    def all_reduce_s(self, tokens: int) -> float:
        """Two all-reduces of the activations per layer across the TP group (ring, NVLink)."""
        if self.tp == 1:
            return 0.0
        activations = tokens * self.model.hidden_size * ACTIVATION_BYTES
        ring = 2 * (self.tp - 1) / self.tp * activations
        return 2 * self.model.layers * ring / self.gpu.nvlink_bytes_per_s

    def kv_bytes_per_gpu(self, tokens: int) -> int:
        """Bytes each GPU reads to move ``tokens`` tokens of KV (all GPUs read in parallel)."""
        return tokens * kv_bytes_per_token_per_gpu(self.model, self.tp)

    def transfer(self, tokens: int) -> Cost:
        """One NIXL READ of ``tokens`` tokens of KV: a fixed step plus bytes over the link."""
        link_s = self.kv_bytes_per_gpu(tokens) / self.fabric.bytes_per_s_per_gpu
        return Cost(steps=1, link_s=link_s)

    def reused_tokens(self, prompt: int) -> int:
        """Prefix tokens read back from decode: whole blocks before this turn's suffix."""
        prefix = max(prompt - self.suffix_tokens, 0)
        return prefix // self.block * self.block


@dataclass(frozen=True)
class TurnCosts:
    """The cost terms of one turn; ``Prediction`` turns them into milliseconds."""

    prompt_tokens: int
    reused_tokens: int
    prefill_off: Cost
    prefill_on: Cost
    kv_transfer: Cost
    handoff: Cost

    @property
    def ttft_off(self) -> Cost:
        """Time to first token with reuse off."""
        return self.prefill_off + self.handoff

    @property
    def ttft_on(self) -> Cost:
        """Time to first token with reuse on."""
        return self.prefill_on + self.handoff


def turn_costs(
    deployment: Deployment, prompt: int, reused: int | None = None, suffix: int | None = None
) -> TurnCosts:
    """Cost terms of one turn of ``prompt`` tokens (see the module docstring).

    ``reused`` (the prefix ON reads back) and ``suffix`` (the new tokens handed to decode)
    default to the deployment's whole blocks before its suffix and its suffix; a measured turn
    passes its own.
    """
    if prompt < 1:
        raise ValueError(f"prompt length must be >= 1 token, got {prompt}")
    reused = deployment.reused_tokens(prompt) if reused is None else reused
    suffix = deployment.suffix_tokens if suffix is None else suffix
    if not 0 <= reused < prompt:
        raise ValueError(f"reused tokens must be in [0, {prompt}), got {reused}")
    computed = prompt - reused
    step = Cost(steps=1)
    kv_read = deployment.transfer(reused)
    return TurnCosts(
        prompt_tokens=prompt,
        reused_tokens=reused,
        prefill_off=step + deployment.compute(0, prompt),
        prefill_on=step + kv_read + deployment.compute(reused, computed),
        kv_transfer=kv_read,
        handoff=deployment.transfer(min(suffix, prompt)),
    )


@dataclass(frozen=True)
class Prediction:
    """Predicted times of one turn, in milliseconds, and the reuse path's physical floor."""

    prompt_tokens: int
    reused_tokens: int
    ttft_off_ms: float
    ttft_on_ms: float
    prefill_off_ms: float
    prefill_on_ms: float
    kv_transfer_ms: float
    kv_floor_ms: float
    kv_bytes_per_gpu: int

    @property
    def speedup(self) -> float:
        """TTFT off over TTFT on."""
        return self.ttft_off_ms / self.ttft_on_ms


def predict(deployment: Deployment, eff: Efficiency, prompt: int) -> Prediction:
    """Predicted TTFT off/on, prefill durations and KV transfer for one prompt length."""
    costs = turn_costs(deployment, prompt)

    def ms(cost: Cost) -> float:
        return cost.seconds(eff) * 1e3

    return Prediction(
        prompt_tokens=prompt,
        reused_tokens=costs.reused_tokens,
        ttft_off_ms=ms(costs.ttft_off),
        ttft_on_ms=ms(costs.ttft_on),
        prefill_off_ms=ms(costs.prefill_off),
        prefill_on_ms=ms(costs.prefill_on),
        kv_transfer_ms=ms(costs.kv_transfer),
        kv_floor_ms=costs.kv_transfer.floor_s * 1e3,
        kv_bytes_per_gpu=deployment.kv_bytes_per_gpu(costs.reused_tokens),
    )


def recompute_threshold(deployment: Deployment, eff: Efficiency) -> int | None:
    """Smallest reusable prefix (whole blocks) whose READ beats recomputing it; None if never.

    With ``k`` reusable tokens and this turn's suffix ``s``, reuse costs ``X(k) + C(k, s)`` and
    recompute ``C(0, k + s)`` (the prefix rides in the suffix's passes: in an HBM-bound pass
    it adds only its all-reduce traffic). Below the returned count recompute is
    cheaper: set it as ``recomputeThresholdTokens`` (vLLM's ``kv_recompute_threshold``).
    """
    block = deployment.block
    suffix = deployment.suffix_tokens

    def read_wins(blocks: int) -> bool:
        tokens = blocks * block
        reuse = deployment.transfer(tokens) + deployment.compute(tokens, suffix)
        return reuse.seconds(eff) <= deployment.compute(0, tokens + suffix).seconds(eff)

    high = 1
    while not read_wins(high):
        high *= 2
        if high * block > _THRESHOLD_CAP_TOKENS:
            return None
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        if read_wins(middle):
            high = middle
        else:
            low = middle
    return high * block
