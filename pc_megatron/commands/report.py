"""``pc-megatron report RUN_DIR [RUN_DIR ...] --out DIR``: one Markdown page of PNGs for one or
several runs, on the same axes, from each run's ``metrics.jsonl`` alone (nothing else is read,
so it works on a copied or finished run directory).

Panels: held-out accuracy (and, where logged, the exact expected accuracy and each benchmark of
``eval.sets``) against cumulative rollouts and against wall time; reward mean and mean group std per update; the
share of degenerate groups (all correct / all wrong); the allocation counters (rollouts
generated, trained, wasted by cause); the step-time breakdown by phase; the learner/engine
log-prob mismatch. Plus a table per run: accuracies, rollouts, tokens, time, how much of it the learner
and the engines were busy, the largest staleness, reward failures.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from pc_megatron.errors import UserError
from pc_megatron.run.logs import benchmark_keys, read_metrics

WASTE = ("wasted_filtered", "wasted_flushed", "wasted_surplus", "wasted_degenerate")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one Markdown page of plots from the metrics of one or several runs")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for report.md and its PNGs")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print(report([Path(d) for d in args.run_dirs], Path(args.out)))
    return 0


def _label(run_dir: Path, others: list[Path]) -> str:
    """The shortest tail of the path that tells this run from the others."""
    parts = run_dir.resolve().parts
    for k in range(1, len(parts) + 1):
        tail = "/".join(parts[-k:])
        if all("/".join(o.resolve().parts[-k:]) != tail for o in others if o != run_dir):
            return tail
    return str(run_dir)


def load_runs(run_dirs: list[Path]) -> dict[str, list[dict]]:
    runs = {}
    for d in run_dirs:
        if not (d / "metrics.jsonl").is_file():
            raise UserError(f"{d}: no metrics.jsonl; pass run directories that `pc-megatron train` wrote")
        rows = read_metrics(d)
        if not rows:
            raise UserError(f"{d}/metrics.jsonl is empty: the run has not finished its first evaluation")
        runs[_label(d, run_dirs)] = rows
    return runs


def _updates(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("step", 0) >= 1 and "time_step_s" in r]


def _wall(rows: list[dict]) -> list[float]:
    return list(itertools.accumulate(r.get("time_step_s", 0.0) for r in rows))


def _panel_accuracy(ax, runs, x: str) -> None:
    for (name, rows), color in zip(runs.items(), itertools.cycle(f"C{i}" for i in range(10)), strict=False):
        wall = _wall(rows)
        benchmarks = [k for k in benchmark_keys(rows) if k != "eval/mean"]
        keys = [("eval_accuracy", "-", "held-out"), ("eval_expected_accuracy", "--", "expected")]
        keys += [(k, ":", k[5:]) for k in benchmarks]  # eval.sets, one line each (their mean is eval_accuracy)
        for key, style, tag in keys:
            pts = [
                (r["cum_rollouts"] if x == "rollouts" else w, r[key])
                for r, w in zip(rows, wall, strict=True)
                if key in r
            ]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", markersize=2, color=color, label=f"{name} ({tag})")
    ax.set_xlabel("cumulative rollouts" if x == "rollouts" else "wall time (s, sum of step times)")
    ax.set_ylabel("held-out accuracy")


def _smooth(ys: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` points (fewer at the start)."""
    acc = list(itertools.accumulate(ys, initial=0.0))
    return [(acc[i + 1] - acc[max(0, i + 1 - window)]) / min(i + 1, window) for i in range(len(ys))]


def _panel_per_update(ax, runs, keys: tuple[str, ...], ylabel: str, smooth: bool = True) -> None:
    """One line per run and key; with ``smooth`` and over 20 updates, a trailing mean over a
    twentieth of the run (the raw values faint behind it)."""
    window = 1
    for (name, rows), color in zip(runs.items(), itertools.cycle(f"C{i}" for i in range(10)), strict=False):
        ups = _updates(rows)
        window = max(1, len(ups) // 20) if smooth else 1
        for key, style in zip(keys, ("-", "--", ":"), strict=False):
            pts = [(r["step"], r[key]) for r in ups if key in r]
            if pts:
                xs, ys = zip(*pts, strict=True)
                if window > 1:
                    ax.plot(xs, ys, style, color=color, linewidth=0.5, alpha=0.25)
                ax.plot(xs, _smooth(list(ys), window), style, color=color, linewidth=1.2, label=f"{name} {key}")
    ax.set_xlabel("update" + (f" (lines: trailing mean over {window} updates)" if window > 1 else ""))
    ax.set_ylabel(ylabel)


def _trained_degenerate(rows: list[dict]) -> float:
    """Rollouts trained in groups that were all correct or all wrong (zero advantage: no gradient)."""
    return sum(
        r.get("sched/step_trained", 0) * (r.get("frac_all_correct", 0.0) + r.get("frac_all_wrong", 0.0))
        for r in _updates(rows)
    )


def _panel_counters(ax, runs) -> None:
    names = list(runs)
    degenerate = [_trained_degenerate(runs[n]) for n in names]
    trained = [runs[n][-1].get("sched/cum_trained", 0) for n in names]
    stacks = {
        "trained, informative": [t - d for t, d in zip(trained, degenerate, strict=True)],
        "trained, degenerate (zero advantage)": degenerate,
        **{cat: [runs[n][-1].get(f"sched/cum_{cat}", 0) for n in names] for cat in WASTE},
    }
    bottoms = [0.0] * len(names)
    for cat, vals in stacks.items():
        if any(vals):
            ax.bar(range(len(names)), vals, bottom=bottoms, label=cat)
            bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("rollouts (cumulative, at the last step)")


def _phase_means(rows: list[dict]) -> dict[str, float]:
    ups = _updates(rows)
    phases = sorted({k for r in ups for k in r if k.startswith("time_") and k.endswith("_s") and k != "time_step_s"})
    return {p[5:-2]: sum(r.get(p, 0.0) for r in ups) / max(len(ups), 1) for p in phases}


def _panel_phases(ax, runs) -> None:
    names = list(runs)
    means = {n: _phase_means(runs[n]) for n in names}
    phases = sorted({p for m in means.values() for p in m})
    bottoms = [0.0] * len(names)
    for p in phases:
        vals = [means[n].get(p, 0.0) for n in names]
        ax.bar(range(len(names)), vals, bottom=bottoms, label=p)
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("mean seconds per update, by phase")


def _busy(rows: list[dict], side: str) -> str:
    """The share of the steps' wall time the learner or the engines worked ('-' for runs before it was logged)."""
    wall = sum(r.get("time_step_s", 0.0) for r in rows)
    busy = [r[f"time/{side}_busy_s"] for r in rows if f"time/{side}_busy_s" in r]
    return f"{sum(busy) / wall:.0%}" if busy and wall else "-"


def _table(runs: dict[str, list[dict]]) -> str:
    lines = [
        "| run | updates | held-out acc. first → last (best) | expected acc. first → last (best) | rollouts "
        "| generated tokens | wall s | mean step s | learner / engines busy | staleness max "
        "| reward timeouts / errors | max log-prob mismatch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def acc(rows: list[dict], key: str) -> str:
        v = [r[key] for r in rows if key in r]
        return f"{v[0]:.3f} → {v[-1]:.3f} ({max(v):.3f})" if v else "-"

    for name, rows in runs.items():
        ups = _updates(rows)
        wall = sum(r.get("time_step_s", 0.0) for r in rows)
        lines.append(
            f"| {name} | {len(ups)} | {acc(rows, 'eval_accuracy')} | {acc(rows, 'eval_expected_accuracy')} "
            f"| {rows[-1].get('cum_rollouts', 0):,} | {rows[-1].get('cum_generated_tokens', 0):,} | {wall:.0f} "
            f"| {wall / max(len(ups), 1):.2f} | {_busy(ups, 'learner')} / {_busy(ups, 'engine')} "
            f"| {max((r.get('rollout/staleness_max', 0) for r in ups), default=0)} "
            f"| {sum(r.get('reward/timeouts', 0) for r in ups)} / "
            f"{sum(r.get('reward/errors', 0) for r in ups)} "
            f"| {max((r.get('logprob_mismatch_max', 0.0) for r in ups), default=0.0):.1e} |"
        )
    return "\n".join(lines)


def _save(fig, path: Path) -> None:
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.savefig(path, dpi=110, bbox_inches="tight")


FIGURES = {
    "accuracy.png": "Held-out accuracy against rollouts and against wall time",
    "learning.png": "Reward and group spread per update; degenerate groups",
    "allocation.png": "Where the rollouts went; where the step time went",
    "mismatch.png": "Learner/engine log-prob mismatch (a weight-sync or mapping bug shows here)",
}


def report(run_dirs: list[Path], out: Path) -> Path:
    """Writes ``out/report.md`` and its PNGs (``FIGURES``); returns the Markdown file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(run_dirs)
    out.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    _panel_accuracy(a, runs, "rollouts")
    _panel_accuracy(b, runs, "wall")
    _save(fig, out / "accuracy.png")
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    _panel_per_update(a, runs, ("reward_mean", "mean_group_std"), "reward mean (-), group std (--)")
    _panel_per_update(b, runs, ("frac_all_correct", "frac_all_wrong"), "groups all correct (-), all wrong (--)")
    _save(fig, out / "learning.png")
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    _panel_counters(a, runs)
    _panel_phases(b, runs)
    _save(fig, out / "allocation.png")
    fig, a = plt.subplots(figsize=(6, 4))
    _panel_per_update(
        a, runs, ("logprob_mismatch", "logprob_mismatch_max"), "log-prob mismatch: mean (-), max (--)", smooth=False
    )
    a.set_yscale("log")
    _save(fig, out / "mismatch.png")
    plt.close("all")
    md = [f"# Report: {', '.join(runs)}", "", _table(runs), ""]
    md += [f"## {title}\n\n![{name}]({name})\n" for name, title in FIGURES.items()]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path
