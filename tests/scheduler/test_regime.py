"""A pool's regime from sampled counts (``pc_megatron/scheduler/regime.py``, behind `pc-megatron
survey`): the fit of pass rates, what it predicts, and the per-level skill figures."""

from __future__ import annotations

import random

import pytest

from pc_megatron.config import load_config
from pc_megatron.scheduler.regime import analyse, by_level, degenerate_share, fit_prior, mixed_at, pass_at


def _counts(rates: list[float], k: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(sum(rng.random() < p for _ in range(k)), k) for p in rates]


def test_pass_at_k_and_mixed_groups_match_counting_every_subset_of_the_samples():
    """The per-level figures a skill is judged by: pass@8 and the share of mixed groups of n, from 16
    samples a prompt, equal the means over every 8- (n-) subset of those samples."""
    from itertools import combinations

    for c in (0, 1, 5, 15, 16):
        outcomes = [1] * c + [0] * (16 - c)
        subsets = list(combinations(outcomes, 8))
        assert pass_at(c, 8, 16) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
        assert mixed_at(c, 8, 16) == pytest.approx(sum(0 < sum(s) < 8 for s in subsets) / len(subsets))
    assert pass_at(3, 1, 16) == pytest.approx(3 / 16)


def test_by_level_reports_each_family_and_accuracy_among_boxed_answers():
    from pc_megatron.data.dataset import PromptRow

    rows = [PromptRow(id=str(i), prompt="q", answer="1", meta={"family": f}) for i, f in enumerate("AAB")]
    levels = by_level(rows, correct=[16, 0, 4], boxed=[16, 8, 8], k=16, n=8)
    assert list(levels) == ["A", "B", "all"]
    assert levels["A"]["pass@1"] == 0.5 and levels["A"]["pass@8"] == 0.5 and levels["A"]["mixed@8"] == 0.0
    assert levels["A"]["boxed"] == 0.75 and levels["A"]["acc_boxed"] == pytest.approx(16 / 24)
    assert levels["B"]["acc_boxed"] == 0.5 and levels["all"]["prompts"] == 3


def test_the_fit_recovers_the_degenerate_share_that_raw_counts_overstate():
    """A pool of 40% hopeless, 30% solved and 30% coin-flip prompts, 8 tries each: the raw share of
    all-alike groups at k = 8 counts the coin flips' lucky runs; the fit's share at n = 32 must be near
    the true 0.70 while the raw counts, read as pass rates, would say far more prompts are hopeless or
    solved than are."""
    rates = [0.0] * 400 + [1.0] * 300 + [0.5] * 300
    truth = {n: 0.7 + 0.3 * 2 * 0.5**n for n in (8, 32)}
    counts = _counts(rates, 8, seed=0)
    prior = fit_prior(counts)
    for n, want in truth.items():
        assert degenerate_share(prior, n) == pytest.approx(want, abs=0.03), n
    raw_alike = sum(c in (0, 8) for c, _ in counts) / len(counts)
    assert raw_alike > truth[32]  # reading counts as rates overstates it at larger n


def test_no_policy_is_favoured_on_a_pool_without_degenerate_groups():
    counts = _counts([0.5] * 200, 16, seed=1)
    sched = load_config("tiny").scheduler
    *_, ratios, verdict = analyse(counts, sched, B=8, n=8, steps=10, boots=4, seed=0)
    assert verdict.startswith("no policy is clearly better") and ratios["grpo"] == 1.0


def test_a_pool_of_mostly_hopeless_prompts_favours_filtering():
    """80% hopeless prompts at n = 8: GRPO spends most rollouts on all-wrong groups; the allocators
    that pilot or skip such prompts need fewer rollouts per informative group (simulated: adaptive
    about 0.4x, Pilot-Commit about 0.7x), and the survey says which, clearly."""
    counts = _counts([0.0] * 800 + [0.4] * 200, 16, seed=2)
    sched = load_config("tiny").scheduler
    _, _, intervals, ratios, verdict = analyse(counts, sched, B=8, n=8, steps=40, boots=6, seed=0)
    assert ratios["pilot_commit"] < 0.9 and ratios["adaptive"] < 0.6 and intervals["adaptive/grpo"][1] < 1.0
    assert verdict.startswith("adaptive:") and "fewer rollouts per informative group than grpo" in verdict


def test_the_verdict_names_what_an_allocator_pays_per_update():
    """An allocator buys informative groups with rollouts no update trains on. On smollm2-arith's pool
    (docs/results/regime_map.md) that lost: the survey favoured adaptive by rollouts per informative group, but
    updates limited learning there. So the forecast gives each policy's rollouts per update, GRPO's
    being exactly B x n, and a favoured allocator's verdict says what it costs per update: within
    GRPO's for adaptive under its budget, and with the caveat where it spends more (no budget)."""
    counts = _counts([0.0] * 800 + [0.4] * 200, 16, seed=2)
    sched = load_config("tiny").scheduler
    for budget, spends_more in ((1.0, False), (0.0, True)):
        sched.adaptive_budget = budget
        _, point, intervals, _, verdict = analyse(counts, sched, B=8, n=8, steps=40, boots=6, seed=0)
        assert point["per_update"]["grpo"] == 8 * 8
        u = point["per_update"]["adaptive"] / 64
        lo, hi = intervals["adaptive/grpo per update"]
        assert verdict.startswith("adaptive:") and f"at {u:.2f}x grpo's rollouts per update" in verdict
        assert (1.0 < lo <= u <= hi) if spends_more else max(u, hi) <= 1.0  # the cap holds in every resample
        assert ("not updates, limit learning" in verdict) == spends_more
