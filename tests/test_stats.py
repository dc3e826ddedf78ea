"""The paired figures of the allocation benchmark (``pc_megatron/stats.py``) on curves whose answers are
known."""

import math

import pytest

from pc_megatron.stats import paired, ratio_interval, value_at


def test_value_at_interpolates_and_is_none_past_the_end():
    pts = [(0, 0.4), (100, 0.5), (300, 0.7)]
    assert value_at(pts, 0) == 0.4 and value_at(pts, 50) == pytest.approx(0.45)
    assert value_at(pts, 200) == pytest.approx(0.6) and value_at(pts, 300) == 0.7
    assert value_at(pts, 301) is None


def test_ratio_interval_is_geometric_and_stays_positive():
    r = ratio_interval([0.5, 2.0, 1.0])
    assert r["mean"] == pytest.approx(1.0)
    assert 0 < r["ci95"][0] < 1 < r["ci95"][1]
    assert r["ci95"][0] * r["ci95"][1] == pytest.approx(1.0)  # symmetric in "fewer" and "more"
    assert ratio_interval([])["mean"] is None


def _line(slope: float, step: float, n: int, start: float = 0.4):
    return [(i * step, start + slope * i * step) for i in range(n + 1)]


def test_a_method_twice_as_fast_per_rollout_reads_2x_and_a_positive_gain_at_every_seed():
    seeds = (0, 1, 2, 3, 4)
    curves = {}
    for s in seeds:
        jitter = 1e-6 * (s + 1)
        curves["grpo", s] = _line(1e-4 + jitter, 100, 10)  # +0.1 over 1,000 rollouts
        curves["fast", s] = _line(2 * (1e-4 + jitter), 125, 10)  # twice the slope, more rollouts per update
    p = paired(curves, ("grpo", "fast"), seeds, fraction=0.4)
    assert p["budget_rollouts"] == 1000  # the fewest any run made
    fast = p["methods"]["fast"]
    assert fast["final_gain"]["mean"] == pytest.approx(0.1 + 1000 * 3e-6)  # twice GRPO's gain at B
    assert fast["final_gain"]["ci95"][0] > 0 and fast["auc_gain"]["ci95"][0] > 0
    # GRPO's final (0.5 at 1,000) is reached by the fast method at 500: 2x fewer, at every seed
    assert fast["to_base_final"]["reached"] == "5/5"
    assert fast["to_base_final"]["mean"] == pytest.approx(2.0, rel=0.1)
    # 40% of the best gain (~0.2 at B, the fast method's): GRPO gets there near 900, the fast near 450
    assert fast["to_fraction"]["reached"] == "5/5"
    # 2x up to the evaluation grid (a target counts as reached at the first evaluation at or above it)
    assert 1.5 < fast["to_fraction"]["ci95"][0] <= fast["to_fraction"]["ci95"][1] < 2.2
    # a seed where GRPO never gets there is counted, not guessed
    p = paired(curves, ("grpo", "fast"), seeds, fraction=0.6)
    assert p["methods"]["fast"]["to_fraction"]["reached"] == "0/5"


def test_equal_methods_read_no_difference_and_unreached_targets_are_counted_not_guessed():
    seeds = (0, 1, 2)
    curves = {}
    for s in seeds:
        wiggle = [0.0, 0.01, -0.01][s]
        curves["grpo", s] = [(0, 0.4), (100, 0.45 + wiggle), (200, 0.5)]
        curves["same", s] = [(0, 0.4), (100, 0.45 - wiggle), (200, 0.5)]
        curves["flat", s] = [(0, 0.4), (100, 0.4), (200, 0.4)]
    p = paired(curves, ("grpo", "same", "flat"), seeds)
    same, flat = p["methods"]["same"], p["methods"]["flat"]
    assert same["final_gain"]["mean"] == pytest.approx(0.0) and same["to_base_final"]["mean"] == pytest.approx(1.0)
    lo, hi = same["auc_gain"]["ci95"]
    assert lo < 0 < hi
    assert flat["to_base_final"]["reached"] == "0/3" and flat["to_base_final"]["mean"] is None
    assert flat["final_gain"]["ci95"][1] < 0
    assert not math.isnan(p["best_gain"]) and p["best_gain"] == pytest.approx(0.1)
