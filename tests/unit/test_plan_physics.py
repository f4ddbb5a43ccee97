"""Prefill FLOPs (linear and quadratic terms) and the cost arithmetic."""

from __future__ import annotations

import pytest

from disagg.plan import catalog
from disagg.plan.physics import (
    Cost,
    Efficiency,
    _capped_pairs,
    _causal_pairs,
    attention_flops,
    prefill_flops,
)


@pytest.mark.parametrize(("context", "new"), [(0, 1), (0, 7), (5, 3), (100, 40)])
def test_pair_counts_match_brute_force(context: int, new: int) -> None:
    keys_seen = [i + 1 for i in range(context, context + new)]
    assert _causal_pairs(context, new) == sum(keys_seen)
    assert _capped_pairs(context, new, 8) == sum(min(k, 8) for k in keys_seen)


def test_dense_attention_is_quadratic_and_linear_part_is_two_flops_per_weight() -> None:
    qwen = catalog.model("qwen3-32b")
    linear = 2 * qwen.matmul_params_per_token
    assert prefill_flops(qwen, 0, 1000) - attention_flops(qwen, 0, 1000) == 1000 * linear
    ratio = attention_flops(qwen, 0, 20000) / attention_flops(qwen, 0, 10000)
    assert ratio == pytest.approx(4, rel=1e-3)
    # 24k tokens: QK^T and AV over the causal half, 64 layers of 64 heads x 128.
    expected = 64 * 4 * 64 * 128 * (24000 * 24001 / 2)
    assert attention_flops(qwen, 0, 24000) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["qwen3-32b", "glm-5-fp8"])
def test_prefill_splits_at_any_context(name: str) -> None:
    spec = catalog.model(name)
    whole = prefill_flops(spec, 0, 6000)
    assert prefill_flops(spec, 0, 4000) + prefill_flops(spec, 4000, 2000) == pytest.approx(whole)


def test_sparse_attention_grows_linearly_past_top_k_except_the_indexer() -> None:
    glm = catalog.model("glm-5-fp8")
    assert glm.sparse is not None
    per_pair_indexer = 2 * glm.sparse.heads * glm.sparse.head_dim * glm.layers
    main = attention_flops(glm, 0, 30000) - per_pair_indexer * _causal_pairs(0, 30000)
    main_later = attention_flops(glm, 0, 40000) - per_pair_indexer * _causal_pairs(0, 40000)
    per_query = (main_later - main) / 10000
    assert per_query == pytest.approx(glm.layers * 2 * 64 * (512 + 64 + 512) * 2048)


def test_cost_is_linear_in_the_three_constants() -> None:
    cost = Cost(steps=2, compute_s=0.3, link_s=0.05) + Cost(steps=1, link_s=0.05)
    eff = Efficiency(compute=0.5, link=0.25, fixed_overhead_s=0.01)
    assert cost.seconds(eff) == pytest.approx(3 * 0.01 + 0.3 / 0.5 + 0.1 / 0.25)
    assert cost.floor_s == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("compute", "link", "overhead"), [(0.0, 0.5, 0.0), (0.5, 1.5, 0.0), (0.5, 0.5, -1.0)]
)
def test_efficiency_rejects_unphysical_values(compute: float, link: float, overhead: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        Efficiency(compute, link, overhead)
