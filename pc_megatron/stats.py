"""Statistics over seeds and accuracy curves: t-intervals, intervals of ratios, curves read at equal
rollouts, and the paired comparison of methods by seed (``pc-megatron compare``, the benchmark
tools, ``pc-megatron survey``'s bootstrap intervals)."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

# two-sided 95% Student-t quantiles by degrees of freedom (1..30); normal beyond
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131]
_T95 += [2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def interval(values: list[float]) -> dict[str, Any]:
    """Mean and a 95% t-interval over seeds (no interval from one value)."""
    if not values:
        return {"mean": None, "ci95": None, "n": 0}
    mean = statistics.mean(values)
    if len(values) < 2:
        return {"mean": mean, "ci95": None, "n": 1}
    t = _T95[len(values) - 2] if len(values) - 1 <= len(_T95) else 1.96
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": len(values)}


def ratio_interval(values: list[float]) -> dict[str, Any]:
    """Geometric mean of positive ratios and a 95% t-interval on their logs: a ratio's interval
    stays positive and is symmetric in "1.5x fewer" and "1.5x more" (a plain t-interval of three
    ratios reached below zero in the regime map)."""
    logs = interval([math.log(v) for v in values])
    if logs["mean"] is None:
        return logs
    return {
        "mean": math.exp(logs["mean"]),
        "ci95": [math.exp(v) for v in logs["ci95"]] if logs["ci95"] else None,
        "n": logs["n"],
    }


def percentile_interval(values: list[float]) -> tuple[float, float]:
    """The 2.5% and 97.5% points of ``values`` (a bootstrap's 95% interval)."""
    v = sorted(values)
    return v[int(0.025 * (len(v) - 1))], v[round(0.975 * (len(v) - 1))]


def format_interval(d: dict | None, spec: str) -> str:
    """``interval``'s figure as ``mean [lo, hi]`` (the mean alone without an interval; '-' without one)."""
    if not d or d["mean"] is None:
        return "-"
    if d["ci95"] is None:
        return format(d["mean"], spec)
    lo, hi = d["ci95"]
    return f"{format(d['mean'], spec)} [{format(lo, spec)}, {format(hi, spec)}]"


def curve(rows: list[dict], key: str) -> list[tuple[float, float]]:
    return [(r["cum_rollouts"], r[key]) for r in rows if key in r]


def rollouts_to(points: list[tuple[float, float]], target: float) -> float | None:
    return next((x for x, y in points if y >= target - 1e-12), None)


def area(points: list[tuple[float, float]], budget: float) -> float:
    """Mean accuracy over rollouts [0, budget]: the linearly interpolated curve's area / budget."""
    total = 0.0
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 >= budget:
            break
        if x1 > budget:
            y1 = y0 + (y1 - y0) * (budget - x0) / (x1 - x0)
            x1 = budget
        total += (x1 - x0) * (y0 + y1) / 2
    return total / budget


def value_at(points: list[tuple[float, float]], x: float) -> float | None:
    """Accuracy at ``x`` rollouts on the linearly interpolated curve; None past its last point."""
    if not points or x > points[-1][0] + 1e-9:
        return None
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y1 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Point-wise mean of curves evaluated at the same rollout counts (GRPO's are: its rollouts
    per step are fixed); truncated to the shortest."""
    k = min(len(c) for c in curves)
    return [(statistics.mean(c[i][0] for c in curves), statistics.mean(c[i][1] for c in curves)) for i in range(k)]


def paired(
    curves: dict[tuple[str, int], list[tuple[float, float]]],
    methods: tuple[str, ...],
    seeds: tuple[int, ...],
    base: str = "grpo",
    fraction: float = 0.5,
) -> dict[str, Any]:
    """Each method against ``base`` at the same seed (same pool order, same held-out set), by
    figures that do not hinge on one point of one curve:

    - ``auc_gain``: mean accuracy over the first B rollouts minus the base's, B being the fewest
      rollouts any run made (equal rollouts for all);
    - ``final_gain``: accuracy at B rollouts minus the base's at B;
    - ``to_fraction``: the base's rollouts over the method's to reach start + ``fraction`` x the
      best method's mean gain at B (> 1: the method needs fewer);
    - ``to_base_final``: the same ratio to the base's final accuracy at that seed (the issue's
      "reaches GRPO's final accuracy with fewer rollouts").

    A ratio is taken at the seeds where both runs reached the target (``reached`` counts them);
    its interval is over their logs. Differences are paired by seed, t-intervals.
    """
    budget = min(c[-1][0] for c in curves.values())
    gains = {m: statistics.mean(value_at(curves[m, s], budget) - curves[m, s][0][1] for s in seeds) for m in methods}
    best = max(gains.values())
    out: dict[str, Any] = {
        "base": base,
        "budget_rollouts": budget,
        "fraction": fraction,
        "mean_gain": gains,
        "best_gain": best,
        "methods": {},
    }
    for m in methods:
        if m == base:
            continue
        auc, final, frac, fin = [], [], [], []
        reached = {"to_fraction": 0, "to_base_final": 0}
        for s in seeds:
            cm, cb = curves[m, s], curves[base, s]
            auc.append(area(cm, budget) - area(cb, budget))
            final.append(value_at(cm, budget) - value_at(cb, budget))
            for name, target, into in (
                ("to_fraction", cb[0][1] + fraction * best, frac),
                ("to_base_final", cb[-1][1], fin),
            ):
                rb, rm = rollouts_to(cb, target), rollouts_to(cm, target)
                # a target at or below the start is reached at 0 rollouts by both: no ratio
                if rb and rm:
                    reached[name] += 1
                    into.append(rb / rm)
        out["methods"][m] = {
            "auc_gain": interval(auc),
            "final_gain": interval(final),
            "to_fraction": {**ratio_interval(frac), "reached": f"{reached['to_fraction']}/{len(seeds)}"},
            "to_base_final": {**ratio_interval(fin), "reached": f"{reached['to_base_final']}/{len(seeds)}"},
        }
    return out


def paired_markdown(p: dict) -> str:
    """The paired figures (``paired``) as a table."""
    lines = [
        f"Against {p['base']} at the same seed, at equal rollouts B = {p['budget_rollouts']:,.0f}; best mean gain "
        f"by B {p['best_gain']:+.4f}. Ratios: {p['base']}'s rollouts over the method's (> 1: fewer), geometric "
        "mean over the seeds where both reached the target.",
        "",
        f"| method | AUC gain | accuracy gain at B | to {p['fraction']:.0%} of best gain | reached "
        f"| to {p['base']}'s final | reached |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, r in p["methods"].items():
        cells = [
            m,
            format_interval(r["auc_gain"], "+.4f"),
            format_interval(r["final_gain"], "+.4f"),
            format_interval(r["to_fraction"], ".2f"),
            r["to_fraction"]["reached"],
            format_interval(r["to_base_final"], ".2f"),
            r["to_base_final"]["reached"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
