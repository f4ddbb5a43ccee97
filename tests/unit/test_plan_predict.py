"""Predictions for one deployment: reuse arithmetic, the physical floor, the recompute threshold."""

from __future__ import annotations

import pytest

from disagg.plan import catalog
from disagg.plan.calibration import CALIBRATED, published_deployment
from disagg.plan.catalog import Fabric
from disagg.plan.physics import (
    Efficiency,
    kv_bytes_per_token_per_gpu,
    weight_bytes_streamed,
)
from disagg.plan.predict import Deployment, predict, recompute_threshold, turn_costs


def test_reuse_covers_whole_blocks_before_the_suffix() -> None:
    qwen = published_deployment("qwen3-32b")
    assert qwen.block == 16
    assert qwen.reused_tokens(24000) == (24000 - 140) // 16 * 16
    assert qwen.reused_tokens(100) == 0
    glm = published_deployment("glm-5-fp8")
    assert glm.block == 64
    assert glm.reused_tokens(20000) % 64 == 0


def test_floor_is_bytes_over_line_rate() -> None:
    qwen = published_deployment("qwen3-32b")
    p = predict(qwen, CALIBRATED, 24000)
    assert p.kv_bytes_per_gpu == p.reused_tokens * 32768
    assert p.kv_floor_ms == pytest.approx(p.kv_bytes_per_gpu / 50e9 * 1e3)
    assert p.kv_transfer_ms >= p.kv_floor_ms + CALIBRATED.fixed_overhead_s * 1e3 - 1e-9


def test_on_leg_reads_the_prefix_and_computes_the_suffix_over_the_whole_context() -> None:
    qwen = published_deployment("qwen3-32b")
    costs = turn_costs(qwen, 24000)
    computed = 24000 - costs.reused_tokens
    expected = qwen.compute(costs.reused_tokens, computed).compute_s
    assert costs.prefill_on.compute_s == pytest.approx(expected)
    assert costs.prefill_on.link_s == costs.kv_transfer.link_s
    # Attending to the 24k context costs more than the same suffix alone.
    assert expected > qwen.compute(0, computed).compute_s


def test_reuse_gain_grows_with_the_prompt() -> None:
    qwen = published_deployment("qwen3-32b")
    speedups = [predict(qwen, CALIBRATED, n).speedup for n in (2000, 8000, 24000)]
    assert speedups == sorted(speedups)
    assert speedups[-1] > 1


def test_threshold_is_the_break_even_block() -> None:
    qwen = published_deployment("qwen3-32b")
    threshold = recompute_threshold(qwen, CALIBRATED)
    assert threshold is not None and threshold % qwen.block == 0

    def read_minus_recompute(tokens: int) -> float:
        reuse = qwen.transfer(tokens) + qwen.compute(tokens, qwen.suffix_tokens)
        recompute = qwen.compute(0, tokens + qwen.suffix_tokens)
        return reuse.seconds(CALIBRATED) - recompute.seconds(CALIBRATED)

    assert read_minus_recompute(threshold) <= 0 < read_minus_recompute(threshold - qwen.block)


def test_threshold_without_overhead_and_a_compute_bound_suffix_is_one_block() -> None:
    qwen = Deployment(
        catalog.model("qwen3-32b"), catalog.gpu("h200"), 8, catalog.fabric("p5en-efa"), 4096
    )
    assert recompute_threshold(qwen, Efficiency(0.2, 1.0, 0.0)) == qwen.block


def test_a_slow_link_never_pays_off() -> None:
    modem = Fabric("a 1 Mb/s link", rails_per_gpu=1, rail_gbit_per_s=0.001)
    qwen = Deployment(catalog.model("qwen3-32b"), catalog.gpu("h200"), 8, modem)
    assert recompute_threshold(qwen, CALIBRATED) is None


def test_prefill_passes_take_the_longer_of_flops_and_hbm_traffic() -> None:
    fabric = catalog.fabric("p5en-efa")
    glm = catalog.model("glm-5-fp8")
    on_h100 = Deployment(glm, catalog.gpu("h100"), 8, fabric)
    on_h200 = Deployment(glm, catalog.gpu("h200"), 8, fabric)
    # A long pass is compute-bound: the same FLOP peaks give the same time.
    assert on_h100.compute(0, 8192).compute_s == on_h200.compute(0, 8192).compute_s
    # A 140-token suffix streams (nearly) every expert: HBM-bound, then its all-reduces.
    all_reduce = on_h200.all_reduce_s(140)
    assert all_reduce == pytest.approx(2 * 78 * (2 * 7 / 8 * 140 * 6144 * 2) / 450e9)
    short_h100 = on_h100.compute(20000, 140).compute_s - all_reduce
    short_h200 = on_h200.compute(20000, 140).compute_s - all_reduce
    assert short_h100 / short_h200 == pytest.approx(4.8 / 3.35)
    streamed = weight_bytes_streamed(glm, 140) / 8 + 20140 * kv_bytes_per_token_per_gpu(glm, 8)
    assert short_h200 == pytest.approx(streamed / 4.8e12)
    # One GPU has nothing to all-reduce.
    assert Deployment(glm, catalog.gpu("h200"), 1, fabric).all_reduce_s(140) == 0
    # Passes split at --max-batched-tokens and add up.
    chunked = Deployment(glm, catalog.gpu("h200"), 8, fabric, max_batched_tokens=4096)
    first, second = chunked.compute(0, 4096), chunked.compute(4096, 4096)
    assert chunked.compute(0, 8192).compute_s == pytest.approx(first.compute_s + second.compute_s)


def test_moe_passes_touch_more_experts_with_more_tokens() -> None:
    glm = catalog.model("glm-5-fp8")
    assert weight_bytes_streamed(glm, 1) < weight_bytes_streamed(glm, 64)
    # Thousands of tokens touch every expert: the whole FP8 model, ~744 GB less embeddings.
    assert weight_bytes_streamed(glm, 8192) == pytest.approx(glm.params - glm.embedding_params)
    qwen = catalog.model("qwen3-32b")
    assert weight_bytes_streamed(qwen, 1) == weight_bytes_streamed(qwen, 8192)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tp", 0, "--tp"),
        ("suffix_tokens", 0, "--suffix-tokens"),
        ("block_tokens", -1, "--block"),
        ("max_batched_tokens", 0, "--max-batched-tokens"),
    ],
)
def test_deployment_rejects_bad_values(field: str, value: int, message: str) -> None:
    kwargs = {
        "model": catalog.model("qwen3-32b"),
        "gpu": catalog.gpu("h200"),
        "tp": 8,
        "fabric": catalog.fabric("p5en-efa"),
        field: value,
    }
    with pytest.raises(ValueError, match=message):
        Deployment(**kwargs)  # type: ignore[arg-type]
