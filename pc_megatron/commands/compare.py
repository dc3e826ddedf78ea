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

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pc_megatron.commands import add_recipe_arguments, recipe_and_overrides
from pc_megatron.errors import ConfigError
from pc_megatron.run.logs import POLICY_LABELS, plot_accuracy, read_metrics
from pc_megatron.scheduler import POLICIES
from pc_megatron.stats import area, curve, format_interval, interval, mean_curve, paired, paired_markdown, rollouts_to

METHODS = tuple(POLICIES)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run policies on one recipe at several seeds; rollouts to target")
    add_recipe_arguments(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (one run directory per method)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--target", type=float, help="accuracy target (default: the best of GRPO's seed-mean curve)")
    p.add_argument("--seeds", type=int, nargs="+", help="run every method at each seed (default: the recipe's)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (threads are split between them)")
    p.add_argument(
        "--fraction",
        type=float,
        default=0.5,
        help="paired figure: rollouts to reach this share of the best method's gain (default 0.5; "
        "0.9 reads how fast a curve that levels off gets near its level)",
    )
    p.add_argument(
        "--method-overrides",
        nargs="+",
        action="append",
        metavar="METHOD KEY=VALUE",
        help="overrides for one method's runs only (repeatable), e.g. --method-overrides pilot_commit steps=4 "
        "eval.every_steps=1: the same rollouts for methods whose rollouts per step differ",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    recipe, overrides = recipe_and_overrides(args)
    method_overrides: dict[str, list[str]] = {}
    for method, *own in args.method_overrides or ():
        method_overrides.setdefault(method, []).extend(own)
    compare(
        recipe,
        overrides,
        Path(args.out),
        tuple(args.methods),
        args.target,
        tuple(args.seeds or ()),
        args.jobs,
        args.fraction,
        method_overrides,
    )
    return 0


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
    from pc_megatron.config import load_config
    from pc_megatron.runtime.resources import plan_threads, usable_cores

    threads = None
    if not any(o.startswith("threads=") for o in overrides):  # the jobs share the cores
        cores = usable_cores()
        threads = plan_threads(load_config(recipe, overrides), cores[: max(1, len(cores) // jobs)]).learner
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
    from pc_megatron.config import load_config

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
        cells = [
            m,
            format_interval(s["rollouts_to_target"], ",.0f"),
            s["rollouts_to_target"]["reached"],
            *vs,
            format_interval(s["auc"], ".4f"),
            format_interval(s["peak"], ".4f"),
            format_interval(s["greedy_peak"], ".3f"),
            format_interval(s["degenerate_frac_mean"], ".2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if "paired" in result:
        lines += ["", paired_markdown(result["paired"])]
    return "\n".join(lines) + "\n"
