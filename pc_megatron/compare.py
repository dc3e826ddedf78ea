"""Run allocation policies on one recipe at several seeds and compare rollouts to target.

Same model, data, group size and prompts per update for every method and the same seeds; only
``scheduler.policy`` differs, and what ``method_overrides`` gives one method (its steps and eval
spacing, to bring every method to about the same rollouts when their rollouts per step differ).
Every (method, seed) run is a ``pc-megatron train`` process in ``OUT/seed<S>/<method>/``
(``--jobs`` at a time; a finished run is reused, a cut one resumed, and one that died before its
first checkpoint is moved aside to ``<method>.failed-<time>`` and started again).

The compare metric is ``eval_expected_accuracy`` (exact, over 2,500 held-out prompts) when the
runs have it, else greedy ``eval_accuracy``; both are reported. The target is the best point of
GRPO's seed-mean curve (as in the paper, GRPO's best, but without one seed's noise) unless
given; each seed's own GRPO best is reported too. Per method: rollouts to target (mean and 95%
interval over seeds, how many seeds reached it), the ratio to GRPO's and to DAPO's, and the area
under the accuracy-vs-rollouts curve up to the rollouts every run reached (the mean accuracy
over that budget). Beside them, figures paired by seed that do not hinge on one point of one curve
(``paired``: AUC and accuracy gain at equal rollouts, rollouts to a fraction of the best gain and to
GRPO's final accuracy). Writes ``compare.json``, ``compare.md`` and ``compare.png``.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError
from pc_megatron.observability import POLICY_LABELS, plot_accuracy, read_metrics

METHODS = ("grpo", "dapo", "pilot_commit")
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


def mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Point-wise mean of curves evaluated at the same rollout counts (GRPO's are: its rollouts
    per step are fixed); truncated to the shortest."""
    k = min(len(c) for c in curves)
    return [(statistics.mean(c[i][0] for c in curves), statistics.mean(c[i][1] for c in curves)) for i in range(k)]


def degenerate_at_start(first: dict) -> float | None:
    """Fraction of the groups generated at the first update whose rewards are all equal: the
    full n-sample groups (GRPO, DAPO), else the n_p-sample pilots (Pilot-Commit)."""
    for phase in ("full", "pilot"):
        groups = first.get(f"sched/step_groups_{phase}", 0)
        if groups:
            return first[f"sched/step_degenerate_{phase}"] / groups
    return None


def run_summary(rows: list[dict], key: str, target: float) -> dict[str, Any]:
    """One run's figures."""
    wall = list(itertools.accumulate(r.get("time_step_s", 0.0) for r in rows))
    evals = [(r, w) for r, w in zip(rows, wall, strict=True) if key in r]
    hit = next(((r, w) for r, w in evals if r[key] >= target - 1e-12), None)
    updates = [r for r in rows if "frac_all_correct" in r]
    first = next((r for r in rows if r.get("step", 0) >= 1), {})
    greedy = [r["eval_accuracy"] for r in rows if "eval_accuracy" in r]
    return {
        "rollouts_to_target": hit[0]["cum_rollouts"] if hit else None,
        "wall_s_to_target": hit[1] if hit else None,
        "initial": evals[0][0][key],
        "peak": max(r[key] for r, _ in evals),
        "final": evals[-1][0][key],
        "greedy_initial": greedy[0],
        "greedy_peak": max(greedy),
        "greedy_final": greedy[-1],
        "cum_rollouts": rows[-1]["cum_rollouts"],
        "mean_group_std": sum(r["mean_group_std"] for r in updates) / max(len(updates), 1),
        "degenerate_frac_start": degenerate_at_start(first),
        "degenerate_frac_mean": sum(r["frac_all_correct"] + r["frac_all_wrong"] for r in updates)
        / max(len(updates), 1),
        "updates": len(updates),
        "scheduler_time_frac": sum(r.get("time_scheduler_s", 0.0) for r in rows) / max(wall[-1], 1e-9),
    }


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def _run_all(
    recipe: str, overrides: list[str], out: Path, methods, seeds, jobs: int, method_overrides: dict[str, list[str]]
) -> dict[tuple[str, int], Path]:
    """Every (method, seed) run as a ``pc-megatron train`` process, ``jobs`` at a time."""
    threads = (
        None
        if any(o.startswith("threads=") for o in overrides)
        else max(1, load_config(recipe, overrides).threads // jobs)
    )
    todo, dirs = [], {}
    for seed in seeds:
        for method in methods:
            run_dir = out / f"seed{seed}" / method
            dirs[method, seed] = run_dir
            if (run_dir / "summary.json").is_file():
                continue  # finished earlier: reused
            common = [f"seed={seed}", f"scheduler.policy={method}", "progress=false"]
            common += [f"threads={threads}"] if threads else []
            if (run_dir / "checkpoints" / "latest").is_file():
                cmd = ["train", *common, "--resume", str(run_dir)]
            else:
                if run_dir.exists():  # died before its first checkpoint was complete: nothing to resume
                    run_dir.rename(run_dir.with_name(f"{method}.failed-{int(time.time())}"))
                own = method_overrides.get(method, [])
                cmd = ["train", recipe, *overrides, *own, *common, f"out_dir={run_dir.parent}", f"name={method}"]
            todo.append((method, seed, run_dir, [sys.executable, "-m", "pc_megatron.cli", *cmd]))
    running: list[tuple[str, int, Path, subprocess.Popen, Any]] = []
    done = len(dirs) - len(todo)
    while todo or running:
        while todo and len(running) < jobs:
            method, seed, run_dir, cmd = todo.pop(0)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.parent / f"{method}.log", "a")
            running.append((method, seed, run_dir, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
            print(f"started {method} seed {seed}", flush=True)
        time.sleep(1.0)
        for item in [r for r in running if r[3].poll() is not None]:
            method, seed, run_dir, proc, log = item
            log.close()
            running.remove(item)
            if proc.returncode != 0:
                for *_, p, lg in running:
                    p.terminate()
                    lg.close()
                raise RuntimeError(
                    f"{method} at seed {seed} failed (exit {proc.returncode}); see "
                    f"{run_dir.parent / (method + '.log')}. Finished runs are kept: run the same compare again"
                )
            done += 1
            print(f"[{done}/{len(dirs)}] {method} seed {seed} done", flush=True)
    return dirs


def compare(
    recipe: str,
    overrides: list[str],
    out: Path,
    methods: tuple[str, ...] = METHODS,
    target: float | None = None,
    seeds: tuple[int, ...] | None = None,
    jobs: int = 1,
    fraction: float = 0.5,
    method_overrides: dict[str, list[str]] | None = None,
) -> dict:
    if not 0 < fraction <= 1:
        raise ConfigError(f"--fraction {fraction}: the share of the best gain to reach must be in (0, 1]")
    method_overrides = method_overrides or {}
    for method, own in method_overrides.items():
        if method not in methods:
            raise ConfigError(f"overrides for {method}, which is not among --methods {' '.join(methods)}")
        load_config(recipe, [*overrides, *own])  # a bad key or value: one error before any run starts
    out.mkdir(parents=True, exist_ok=True)
    seeds = tuple(seeds) if seeds else (load_config(recipe, overrides).seed,)
    dirs = _run_all(recipe, overrides, out, methods, seeds, jobs, method_overrides)
    rows = {k: read_metrics(d) for k, d in dirs.items()}
    key = (
        "eval_expected_accuracy"
        if all(any("eval_expected_accuracy" in r for r in v) for v in rows.values())
        else "eval_accuracy"
    )
    if target is None:
        if "grpo" not in methods:
            raise ValueError("without --target the target is GRPO's best accuracy: include grpo in --methods")
        target = max(y for _, y in mean_curve([curve(rows["grpo", s], key) for s in seeds]))
    budget = min(r[-1]["cum_rollouts"] for r in rows.values())
    result: dict[str, Any] = {
        "recipe": recipe,
        "overrides": overrides,
        "seeds": list(seeds),
        "metric": key,
        "target": target,
        "auc_budget_rollouts": budget,
        "methods": {},
    }
    for m in methods:
        per_seed = {s: run_summary(rows[m, s], key, target) for s in seeds}
        reached = [p["rollouts_to_target"] for p in per_seed.values() if p["rollouts_to_target"] is not None]
        own = []  # against each seed's own GRPO best
        if "grpo" in methods:
            for s in seeds:
                own_target = max(y for _, y in curve(rows["grpo", s], key))
                own.append(
                    ratio(
                        rollouts_to(curve(rows["grpo", s], key), own_target),
                        rollouts_to(curve(rows[m, s], key), own_target),
                    )
                )
        result["methods"][m] = {
            "rollouts_to_target": {**interval(reached), "reached": f"{len(reached)}/{len(seeds)}"},
            "auc": interval([area(curve(rows[m, s], key), budget) for s in seeds]),
            "peak": interval([p["peak"] for p in per_seed.values()]),
            "final": interval([p["final"] for p in per_seed.values()]),
            "greedy_peak": interval([p["greedy_peak"] for p in per_seed.values()]),
            "degenerate_frac_mean": interval([p["degenerate_frac_mean"] for p in per_seed.values()]),
            "grpo_over_method_per_seed_target": interval([x for x in own if x is not None]) if own else None,
            "per_seed": per_seed,
        }
    per = result["methods"]
    for m in methods:
        for base in ("grpo", "dapo"):
            if base in per and m != base:
                # > 1: the method needs fewer rollouts than the baseline to reach the target
                result[f"{m}_vs_{base}"] = ratio(
                    per[base]["rollouts_to_target"]["mean"], per[m]["rollouts_to_target"]["mean"]
                )
                result[f"{m}_vs_{base}_auc_gain"] = (
                    per[m]["auc"]["mean"] - per[base]["auc"]["mean"] if per[m]["auc"]["mean"] is not None else None
                )
    if "grpo" in methods and len(methods) > 1:
        result["paired"] = paired({k: curve(v, key) for k, v in rows.items()}, tuple(methods), seeds, fraction=fraction)
    (out / "compare.json").write_text(json.dumps(result, indent=2))
    (out / "compare.md").write_text(to_markdown(result))
    curves = {POLICY_LABELS.get(m, m): mean_curve([curve(rows[m, s], key) for s in seeds]) for m in methods}
    plot_accuracy(curves, out / "compare.png", target=target, ylabel=f"{key} (mean of {len(seeds)} seeds)")
    print(to_markdown(result))
    return result


def _fmt(v: Any, spec: str = "") -> str:
    return "not reached" if v is None else format(v, spec)


def _iv(d: dict | None, spec: str) -> str:
    if not d or d["mean"] is None:
        return "-"
    if d["ci95"] is None:
        return format(d["mean"], spec)
    lo, hi = d["ci95"]
    return f"{format(d['mean'], spec)} [{format(lo, spec)}, {format(hi, spec)}]"


def to_markdown(result: dict) -> str:
    lines = [
        f"Metric `{result['metric']}`, seeds {result['seeds']}; target {result['target']:.4f} "
        f"(best of GRPO's seed-mean curve); AUC = mean accuracy over the first "
        f"{result['auc_budget_rollouts']:,} rollouts. Intervals: 95% over seeds.",
        "",
        "| method | rollouts to target | reached | vs GRPO | vs DAPO | AUC | peak | greedy peak | degenerate share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, s in result["methods"].items():
        vs = [
            (
                "-"
                if f"{m}_vs_{b}" not in result
                else _fmt(result[f"{m}_vs_{b}"], ".2f") + ("x" if result[f"{m}_vs_{b}"] else "")
            )
            for b in ("grpo", "dapo")
        ]
        lines.append(
            f"| {m} | {_iv(s['rollouts_to_target'], ',.0f')} | {s['rollouts_to_target']['reached']} "
            f"| {vs[0]} | {vs[1]} | {_iv(s['auc'], '.4f')} | {_iv(s['peak'], '.4f')} | {_iv(s['greedy_peak'], '.3f')} "
            f"| {_iv(s['degenerate_frac_mean'], '.2f')} |"
        )
    if "paired" in result:
        lines += ["", paired_markdown(result["paired"])]
    return "\n".join(lines) + "\n"


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
        lines.append(
            f"| {m} | {_iv(r['auc_gain'], '+.4f')} | {_iv(r['final_gain'], '+.4f')} | {_iv(r['to_fraction'], '.2f')} "
            f"| {r['to_fraction']['reached']} | {_iv(r['to_base_final'], '.2f')} | {r['to_base_final']['reached']} |"
        )
    return "\n".join(lines)
