"""A pool's regime from sampled correct counts, the library behind ``pc-megatron survey``: the
population of pass rates (fitted by EM on the adaptive allocator's grid), the share of all-alike
groups it implies, each allocation policy simulated on pools drawn from it (``simulate.py``), with
bootstrap intervals; and per level (``meta["family"]``) pass@1, pass@k and the share of mixed groups.
Pure Python, like the rest of the scheduler."""

from __future__ import annotations

import dataclasses
import math
import random

from pc_megatron.scheduler.belief import _FLAT, GRID
from pc_megatron.scheduler.config import SchedulerConfig
from pc_megatron.scheduler.policies import POLICIES as _POLICIES
from pc_megatron.scheduler.simulate import simulate
from pc_megatron.stats import percentile_interval

POLICIES = tuple(_POLICIES)
NS = (8, 16, 32, 64)
COSTS = ("per_informative_group", "per_update")  # what the simulation reports of each policy


def fit_prior(counts: list[tuple[int, int]], iters: int = 300) -> list[float]:
    """Population prior on ``GRID`` maximising the likelihood of ``(correct, tries)`` per prompt (EM;
    the binomial coefficient cancels)."""
    like = [[p**c * (1 - p) ** (k - c) for p in GRID] for c, k in counts]
    prior = list(_FLAT)
    for _ in range(iters):
        acc = [0.0] * len(GRID)
        for row in like:
            w = [q * x for q, x in zip(prior, row, strict=True)]
            total = sum(w) or 1.0
            for i, x in enumerate(w):
                acc[i] += x / total
        prior = [a / len(like) for a in acc]
    return prior


def degenerate_share(prior: list[float], n: int) -> float:
    """P(an n-sample group is all correct or all wrong) under the fitted prior."""
    return sum(q * (p**n + (1 - p) ** n) for q, p in zip(prior, GRID, strict=True))


def draw_pool(prior: list[float], size: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return rng.choices(GRID, weights=prior, k=size)


def allocation(prior: list[float], sched: SchedulerConfig, B: int, n: int, steps: int, seed: int) -> dict[str, dict]:
    """Each policy on a pool drawn from ``prior``: rollouts per informative trained group and rollouts
    per update, as ``{"per_informative_group": {policy: v}, "per_update": {policy: v}}``."""
    rates = draw_pool(prior, max(40 * B, 400), seed)
    out: dict[str, dict] = {key: {} for key in COSTS}
    for policy in POLICIES:
        sim = simulate(rates, dataclasses.replace(sched, policy=policy), steps, B, n, seed)
        for key in COSTS:
            out[key][policy] = sim[key]
    return out


def analyse(counts: list[tuple[int, int]], sched: SchedulerConfig, B: int, n: int, steps: int, boots: int, seed: int):
    """The fit, the degenerate shares and the allocation figures, each with a bootstrap interval."""
    prior = fit_prior(counts)
    point = {
        "degenerate": {m: degenerate_share(prior, m) for m in sorted({*NS, n})},
        **allocation(prior, sched, B, n, steps, seed),
    }
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {}
    for b in range(boots):
        resampled = [counts[rng.randrange(len(counts))] for _ in counts]
        q = fit_prior(resampled, iters=100)
        samples.setdefault("degenerate", []).append(degenerate_share(q, n))
        alloc = allocation(q, sched, B, n, steps, seed + 1 + b)
        per_group, per_update = alloc["per_informative_group"], alloc["per_update"]
        for policy in POLICIES:
            samples.setdefault(policy, []).append(per_group[policy])
            samples.setdefault(f"{policy}/grpo", []).append(per_group[policy] / per_group["grpo"])
            samples.setdefault(f"{policy}/grpo per update", []).append(per_update[policy] / per_update["grpo"])
    intervals = {k: percentile_interval(v) for k, v in samples.items()}
    per_group = point["per_informative_group"]
    ratios = {p: per_group[p] / per_group["grpo"] for p in POLICIES}
    best = min(POLICIES, key=lambda p: per_group[p])
    lo, hi = intervals[f"{best}/grpo"]
    if best != "grpo" and hi < 1.0:
        verdict = (
            f"{best}: {1 / ratios[best]:.2f}x fewer rollouts per informative group than grpo "
            f"({1 / hi:.2f}-{1 / lo:.2f})"
        )
        u = point["per_update"][best] / point["per_update"]["grpo"]
        ua, ub = intervals[f"{best}/grpo per update"]
        verdict += f", at {u:.2f}x grpo's rollouts per update ({ua:.2f}-{ub:.2f})"
        if u > 1.0:
            # An allocator buys informative groups with rollouts that no update trains on. That pays where
            # the number of informative groups limits learning and loses where the number of updates does
            # (smollm2-arith's pool: docs/results/regime_map.md); the starting policy alone cannot tell which.
            verdict += ": fewer rollouts to an accuracy only where informative groups, not updates, limit learning"
    else:
        verdict = "no policy is clearly better than grpo here (every ratio's interval reaches 1)"
    return prior, point, intervals, ratios, verdict


def pass_at(c: int, k: int, n: int) -> float:
    """Unbiased pass@k of a prompt answered correctly ``c`` times in ``n`` samples: 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k) if k <= n else float("nan")


def mixed_at(c: int, m: int, n: int) -> float:
    """P(a group of ``m`` drawn without replacement from the ``n`` samples holds both outcomes)."""
    if m > n:
        return float("nan")
    return 1.0 - (math.comb(n - c, m) + math.comb(c, m)) / math.comb(n, m)


def by_level(rows, correct: list[int], boxed: list[int] | None, k: int, n: int) -> dict[str, dict[str, float]]:
    """Per ``meta["family"]`` (the word problems' levels) and overall: pass@1, pass@8 (unbiased, from
    ``k`` samples a prompt), the share of mixed groups of the recipe's ``n``, and with a boxed count
    the share of answers boxed and the accuracy among boxed answers (an unboxed answer is wrong)."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(str(row.meta.get("family", "all")), []).append(i)
    if len(groups) > 1:
        groups["all"] = list(range(len(rows)))
    out = {}
    for fam, idx in sorted(groups.items()):
        fig = {
            "prompts": len(idx),
            "pass@1": sum(correct[i] for i in idx) / (len(idx) * k),
            "pass@8": sum(pass_at(correct[i], 8, k) for i in idx) / len(idx),
            f"mixed@{n}": sum(mixed_at(correct[i], n, k) for i in idx) / len(idx),
        }
        if boxed is not None:
            nb = sum(boxed[i] for i in idx)
            fig["boxed"] = nb / (len(idx) * k)
            fig["acc_boxed"] = sum(correct[i] for i in idx) / nb if nb else float("nan")
        out[fam] = fig
    return out


def histogram(correct: list[int], k: int) -> dict[str, float]:
    """Shares of prompts by estimated pass rate c/k: 0, (0, 0.1], ... (0.9, 1), 1."""
    bands = {"0": 0, **{f"<={b / 10:.1f}": 0 for b in range(1, 10)}, "<1": 0, "1": 0}
    for c in correct:
        p = c / k
        key = "0" if c == 0 else "1" if c == k else "<1" if p > 0.9 else f"<={min(int(-(-p * 10 // 1)), 9) / 10:.1f}"
        bands[key] += 1
    return {b: v / len(correct) for b, v in bands.items()}
