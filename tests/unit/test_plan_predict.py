"""Predictions for one deployment: reuse arithmetic, the physical floor, the recompute threshold."""

from __future__ import annotations

import pytest
from disagg_connector.plan import catalog
from disagg_connector.plan.calibration import CALIBRATED, published_deployment
from disagg_connector.plan.catalog import Fabric
from disagg_connector.plan.physics import Efficiency
from disagg_connector.plan.predict import Deployment, predict, recompute_threshold, turn_costs


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
        read = qwen.transfer(tokens).seconds(CALIBRATED)
        return read - qwen.compute(0, tokens).seconds(CALIBRATED)

    assert read_minus_recompute(threshold) <= 0 < read_minus_recompute(threshold - qwen.block)


def test_threshold_without_overhead_is_one_block() -> None:
    qwen = published_deployment("qwen3-32b")
    assert recompute_threshold(qwen, Efficiency(0.2, 1.0, 0.0)) == qwen.block


def test_a_slow_link_never_pays_off() -> None:
    modem = Fabric("a 1 Mb/s link", rails_per_gpu=1, rail_gbit_per_s=0.001)
    qwen = Deployment(catalog.model("qwen3-32b"), catalog.gpu("h200"), 8, modem)
    assert recompute_threshold(qwen, CALIBRATED) is None


def test_faster_hbm_alone_does_not_change_a_compute_bound_prefill() -> None:
    fabric = catalog.fabric("p5en-efa")
    on_h100 = Deployment(catalog.model("qwen3-32b"), catalog.gpu("h100"), 8, fabric)
    on_h200 = Deployment(catalog.model("qwen3-32b"), catalog.gpu("h200"), 8, fabric)
    assert predict(on_h100, CALIBRATED, 8000) == predict(on_h200, CALIBRATED, 8000)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("tp", 0, "--tp"), ("suffix_tokens", 0, "--suffix-tokens"), ("block_tokens", -1, "--block")],
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
