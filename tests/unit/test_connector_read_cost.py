"""Prefill's measured read-or-recompute decision (connector/disagg_connector/read_cost.py)."""

from __future__ import annotations

import random

import pytest

from disagg_connector.read_cost import Choice, CostModel, fit_nonnegative

PER_REQUEST_S = 0.004
PER_TOKEN_S = 2e-4
ATTENTION_S = 4e-8
READ_FIXED_S = 0.008
READ_PER_TOKEN_S = 1e-5
LINK = "decode-0"


def compute_s(tokens: int, start: int) -> float:
    return PER_REQUEST_S + PER_TOKEN_S * tokens + ATTENTION_S * tokens * (start + tokens / 2)


def handshaken(model: CostModel, *links: str) -> CostModel:
    """``model`` after a first read from each of ``links``: the handshakes, no samples."""
    for link in links or (LINK,):
        model.record_read(4096, 60.0, link)
    return model


def measured_model(noise: float = 0.0, seed: int = 7) -> CostModel:
    """A model fed prefills at several lengths and contexts, and reads of several sizes."""
    rng = random.Random(seed)
    model = handshaken(CostModel())
    for tokens in (128, 512, 900, 1600, 2400):
        for start in (0, 1000, 3000):
            model.record_compute(
                tokens, start, compute_s(tokens, start) * (1 + rng.uniform(0, noise))
            )
    for tokens in (256, 1024, 4096):
        model.record_read(
            tokens, (READ_FIXED_S + READ_PER_TOKEN_S * tokens) * (1 + rng.uniform(0, noise)), LINK
        )
    return model


def test_exact_samples_give_back_the_costs_they_were_made_from() -> None:
    model = measured_model()
    assert model.compute_seconds(1000, 2000) == pytest.approx(compute_s(1000, 2000) - PER_REQUEST_S)
    assert model.read_seconds(2000) == pytest.approx(READ_FIXED_S + READ_PER_TOKEN_S * 2000)
    estimates = model.estimates()
    assert estimates.read_fixed_s == pytest.approx(READ_FIXED_S)
    assert estimates.read_tokens_per_s == pytest.approx(1 / READ_PER_TOKEN_S)
    assert estimates.compute_tokens_per_s == pytest.approx(1 / PER_TOKEN_S)


def test_a_tiny_prefix_is_recomputed_and_a_long_one_read() -> None:
    model = measured_model(noise=0.1)
    # 16 tokens: about 3 ms of compute against the read's 8 ms fixed cost.
    assert model.decide(16, 0, LINK).choice is Choice.RECOMPUTE
    long = model.decide(2000, 0, LINK)
    assert long.choice is Choice.READ
    assert long.read_s is not None and long.compute_s is not None
    assert long.read_s < long.compute_s


def test_the_break_even_point_lies_where_the_two_estimates_cross() -> None:
    model = measured_model()
    # b*n + c*n^2/2 = f + g*n at start 0: n is about 42 tokens for the constants above.
    assert model.decide(40, 0, LINK).choice is Choice.RECOMPUTE
    assert model.decide(45, 0, LINK).choice is Choice.READ


def test_a_slow_link_makes_even_long_prefixes_recompute() -> None:
    model = handshaken(CostModel())
    for tokens in (128, 900, 2400):
        model.record_compute(tokens, 0, compute_s(tokens, 0))
    for tokens in (512, 2048, 8192):
        model.record_read(tokens, 0.05 + 1e-3 * tokens, LINK)
    assert model.decide(2000, 0, LINK).choice is Choice.RECOMPUTE
    assert model.decide(16, 0, LINK).choice is Choice.RECOMPUTE


def test_before_both_sides_are_measured_it_reads() -> None:
    model = handshaken(CostModel())
    assert model.decide(16, 0, LINK).choice is Choice.UNMEASURED
    model.record_compute(600, 0, 0.1)
    assert model.decide(16, 0, LINK).choice is Choice.UNMEASURED
    model.record_read(600, 0.02, LINK)
    assert model.decide(16, 0, LINK).choice is Choice.RECOMPUTE
    assert Choice.UNMEASURED.reads and not Choice.RECOMPUTE.reads


def test_one_read_size_is_taken_as_a_fixed_cost() -> None:
    model = handshaken(CostModel())
    for _ in range(3):
        model.record_compute(600, 0, 0.06)
        model.record_read(600, 0.01, LINK)
    # Same-size samples cannot tell a fixed from a per-token cost: all of it counts as fixed.
    assert model.read_seconds(16) == pytest.approx(0.01)
    assert model.read_seconds(6000) == pytest.approx(0.01)
    # And the same-length prefills give a per-token cost alone.
    assert model.compute_seconds(60, 0) == pytest.approx(0.006)


def test_while_recomputing_wins_it_reads_now_and_then_to_re_measure() -> None:
    model = handshaken(CostModel(probe_every=4))
    model.record_compute(600, 0, 0.06)
    model.record_read(600, 0.05, LINK)
    choices = [model.decide(16, 0, LINK).choice for _ in range(8)]
    assert choices == [Choice.RECOMPUTE] * 3 + [Choice.PROBE] + [Choice.RECOMPUTE] * 3 + [
        Choice.PROBE
    ]
    assert model.decide(6000, 0, LINK).choice is Choice.READ
    assert model.decide(16, 0, LINK).choice is Choice.RECOMPUTE


def test_the_window_follows_a_link_that_got_slower() -> None:
    model = handshaken(CostModel(window=8))
    model.record_compute(1000, 0, 0.2)
    for tokens in (256, 1024):
        model.record_read(tokens, 0.001 + 1e-6 * tokens, LINK)
    assert model.decide(500, 0, LINK).choice is Choice.READ
    for _ in range(4):
        for tokens in (256, 1024):
            model.record_read(tokens, 0.5 + 1e-4 * tokens, LINK)
    assert model.decide(500, 0, LINK).choice is Choice.RECOMPUTE


def test_samples_that_measure_nothing_are_ignored() -> None:
    model = handshaken(CostModel())
    model.record_compute(0, 0, 1.0)
    model.record_compute(100, 0, 0.0)
    model.record_read(0, 1.0, LINK)
    model.record_read(100, -1.0, LINK)
    assert model.estimates().read_fixed_s is None
    assert model.estimates().compute_tokens_per_s is None


def test_a_fit_with_a_negative_term_falls_back_to_fewer_terms() -> None:
    # Time falls with tokens: no non-negative fit with a slope, so the constant alone.
    fit = fit_nonnegative([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)], [3.0, 2.0, 1.0], ((1, 1), (1, 0)))
    assert fit == pytest.approx((2.0, 0.0))
    assert fit_nonnegative([(1.0, 1.0)], [-1.0], ((1, 0),)) is None


def test_each_decode_engine_is_its_own_link_and_a_new_one_starts_from_the_pool() -> None:
    model = handshaken(CostModel())
    for tokens in (128, 900, 2400):
        model.record_compute(tokens, 0, compute_s(tokens, 0))
    for tokens in (256, 1024, 4096):
        model.record_read(tokens, READ_FIXED_S + READ_PER_TOKEN_S * tokens, "near")
    assert model.decide(1000, 0, "far").choice is Choice.READ
    for tokens in (256, 1024):
        model.record_read(tokens, 2.0 + 4e-3 * tokens, "far")
    assert model.decide(1000, 0, "far").choice is Choice.RECOMPUTE
    assert model.decide(1000, 0, "near").choice is Choice.READ


def test_links_beyond_the_limit_forget_the_least_recently_used() -> None:
    model = handshaken(CostModel(max_links=2), "a", "b")
    model.record_compute(1000, 0, 0.2)
    model.record_read(500, 5.0, "a")
    model.record_read(500, 0.001, "b")
    assert model.read_seconds(500, "a") == pytest.approx(5.0)
    handshaken(model, "c")
    # "a", the least recently used, is forgotten: it falls back to the pool of all reads.
    assert model.read_seconds(500, "a") == pytest.approx(model.read_seconds(500))
    assert model.read_seconds(500) == pytest.approx(2.5005)
    assert model.read_seconds(500, "b") == pytest.approx(0.001)


def test_a_links_first_read_is_the_handshake_and_no_sample() -> None:
    model = CostModel()
    model.record_compute(1000, 0, 0.2)
    model.record_read(500, 30.0, LINK)
    assert model.read_seconds(500, LINK) is None
    assert model.decide(500, 0, LINK).choice is Choice.UNMEASURED
    model.record_read(500, 0.01, LINK)
    assert model.read_seconds(500, LINK) == pytest.approx(0.01)
