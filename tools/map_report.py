"""The regime map from the `pc-megatron compare` folders that tools/regime_map.sh writes: per pool
(level), GRPO's degenerate-group share against each method's rollouts to GRPO's best and its
accuracy gain at equal rollouts, with 95% intervals over seeds.

    python tools/map_report.py runs/map [--out docs/results/regime_map] [--levels easy hard ...]

For every method beside GRPO, per level:
- ``ratio``: GRPO's mean rollouts to the target over the method's (> 1: the method needs fewer),
  the target being the best point of GRPO's seed-mean curve (compare.json's ``<m>_vs_grpo``);
  ``reached``: at how many seeds the method got there at all;
- ``paired AUC gain``: the method's mean accuracy over the first B rollouts minus GRPO's at the
  same seed (same pool order, same held-out set), B being the fewest rollouts any run of the
  level made; a t-interval over seeds. Both for the exact expected accuracy and greedy accuracy.
Writes ``OUT.md`` (the table) and ``OUT.png`` (gain and ratio against GRPO's degenerate share).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pc_megatron.run.logs import POLICY_LABELS, read_metrics
from pc_megatron.stats import curve, paired

LEVELS = [
    "easy",
    "hard",
    "graded40",
    "graded70",
    "graded70-grid",
    "graded70-small",
    "graded70-small-grid",
    "graded70-n64",
]


def level_rows(folder: Path) -> dict:
    result = json.loads((folder / "compare.json").read_text())
    seeds, methods = result["seeds"], list(result["methods"])
    runs = {(m, s): read_metrics(folder / f"seed{s}" / m) for m in methods for s in seeds}
    grpo = result["methods"]["grpo"]
    # the paired figures for each accuracy every run has (the real model's runs: greedy only)
    keys = [k for k in ("eval_expected_accuracy", "eval_accuracy") if all(curve(r, k) for r in runs.values())]
    pair = {k: paired({ms: curve(r, k) for ms, r in runs.items()}, tuple(methods), tuple(seeds)) for k in keys}
    out = {
        "level": folder.name,
        "seeds": seeds,
        "metric": keys[0],
        "target": result["target"],
        "budget": pair[keys[0]]["budget_rollouts"],
        "best_gain": pair[keys[0]]["best_gain"],
        "grpo_degenerate": grpo["degenerate_frac_mean"],
        "grpo_rollouts": grpo["rollouts_to_target"],
        "methods": {},
    }
    for m in methods:
        if m == "grpo":
            continue
        last = {s: runs[m, s][-1] for s in seeds}
        main = pair[keys[0]]["methods"][m]
        out["methods"][m] = {
            "ratio": result.get(f"{m}_vs_grpo"),
            # each seed's GRPO rollouts to its own best over the method's to that target
            "ratio_per_seed": result["methods"][m].get("grpo_over_method_per_seed_target"),
            "reached": result["methods"][m]["rollouts_to_target"]["reached"],
            "rollouts": result["methods"][m]["rollouts_to_target"],
            "gain_greedy": pair["eval_accuracy"]["methods"][m]["auc_gain"] if "eval_accuracy" in pair else None,
            "auc_gain": main["auc_gain"],
            "final_gain": main["final_gain"],
            "to_fraction": main["to_fraction"],
            "to_grpo_final": main["to_base_final"],
            "rollouts_per_update": statistics.mean(last[s]["cum_rollouts"] / last[s]["step"] for s in seeds),
            "degenerate": result["methods"][m]["degenerate_frac_mean"],
        }
    return out


def _iv(d: dict | None, spec: str) -> str:
    if not d or d.get("mean") is None:
        return "-"
    if not d.get("ci95"):
        return format(d["mean"], spec)
    lo, hi = d["ci95"]
    return f"{format(d['mean'], spec)} [{format(lo, spec)}, {format(hi, spec)}]"


def to_markdown(levels: list[dict]) -> str:
    lines = [
        "Ratios: GRPO's rollouts over the method's (> 1: the method needs fewer). \"To GRPO's best\": the "
        "paper's metric (target: best point of GRPO's seed-mean curve). The rest are paired by seed at equal "
        "rollouts B (the fewest any run of the level made): AUC gain (mean accuracy over [0, B]), accuracy "
        "gain at B, rollouts to start + 50% of the best method's mean gain at B, and rollouts to GRPO's final "
        "accuracy at that seed (geometric mean over the seeds where both runs reached it). 95% intervals over "
        "seeds. Accuracy: the exact expected accuracy where the runs have it, else greedy.",
        "",
        "| level | GRPO degenerate share | method | rollouts per update | to GRPO's best | AUC gain "
        "| AUC gain, greedy | gain at B | to 50% of best gain | to GRPO's final |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def reached(d: dict) -> str:
        return f"{_iv(d, '.2f')} ({d['reached']})"

    for lv in levels:
        for m, r in lv["methods"].items():
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
            ratio += f" ({r['reached']})"
            greedy = _iv(r["gain_greedy"], "+.3f") if lv["metric"] != "eval_accuracy" else "(the same)"
            lines.append(
                f"| {lv['level']} | {_iv(lv['grpo_degenerate'], '.2f')} | {POLICY_LABELS.get(m, m)} "
                f"| {r['rollouts_per_update']:,.0f} | {ratio} | {_iv(r['auc_gain'], '+.4f')} "
                f"| {greedy} | {_iv(r['final_gain'], '+.4f')} "
                f"| {reached(r['to_fraction'])} | {reached(r['to_grpo_final'])} |"
            )
    return "\n".join(lines) + "\n"


def plot(levels: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = {lv["level"] for lv in levels}

    def shown(level: str, method: str) -> bool:
        """One point per (pool, method): a '-grid' level re-ran only the adaptive allocator
        (after its grid fix) beside the same GRPO and Pilot-Commit runs, so it stands for
        adaptive alone, and its base level for the rest."""
        if level.endswith("-grid"):
            return method == "adaptive"
        return not (method == "adaptive" and f"{level}-grid" in names)

    methods = sorted({m for lv in levels for m in lv["methods"]})
    for k, m in enumerate(methods):
        pts = [
            (lv["grpo_degenerate"]["mean"], lv["methods"][m], lv["level"].removesuffix("-grid"))
            for lv in levels
            if m in lv["methods"] and shown(lv["level"], m)
        ]
        color = f"C{k}"
        for big in (False, True):  # n = 64 or 128 ('-n64', '-n128') apart from n = 32: another marker, no line
            sel = sorted((p for p in pts if bool(re.search(r"-n\d+", p[2])) == big), key=lambda p: p[0])
            if not sel:
                continue
            xs = [p[0] + 0.006 * (k - 1) for p in sel]  # a small offset so the bars do not overlap
            g = [p[1]["auc_gain"] for p in sel]
            yerr = (
                [[x["mean"] - x["ci95"][0] for x in g], [x["ci95"][1] - x["mean"] for x in g]]
                if all(x["ci95"] for x in g)
                else None
            )
            marker, label = ("s", f"{POLICY_LABELS.get(m, m)}, n >= 64") if big else ("o", POLICY_LABELS.get(m, m))
            ax1.errorbar(
                xs,
                [x["mean"] for x in g],
                yerr=yerr,
                marker=marker,
                linestyle="none",
                capsize=3,
                color=color,
                label=label,
            )
            ratios = [(x, p[1]["ratio"], p[2]) for x, p in zip(xs, sel, strict=True) if p[1]["ratio"] is not None]
            ax2.plot(
                [r[0] for r in ratios],
                [r[1] for r in ratios],
                marker=marker,
                linestyle="none",
                color=color,
                label=label,
            )
            for x, p in zip(xs, sel, strict=True):
                ax1.annotate(p[2], (x, p[1]["auc_gain"]["mean"]), fontsize=6, alpha=0.6)
            for x, y, name in ratios:
                ax2.annotate(name, (x, y), fontsize=6, alpha=0.6)
            per_seed = [(x, p[1]["ratio_per_seed"]) for x, p in zip(xs, sel, strict=True) if p[1]["ratio_per_seed"]]
            per_seed = [(x, r) for x, r in per_seed if r.get("ci95")]
            if per_seed:
                ax2.errorbar(
                    [x + 0.004 for x, _ in per_seed],
                    [r["mean"] for _, r in per_seed],
                    yerr=[
                        [r["mean"] - r["ci95"][0] for _, r in per_seed],
                        [r["ci95"][1] - r["mean"] for _, r in per_seed],
                    ],
                    fmt="_",
                    color=color,
                    alpha=0.35,
                    capsize=2,
                    linewidth=1,
                )
    ax1.axhline(0, color="gray", linewidth=1)
    ax1.set_xlabel("GRPO's degenerate-group share (mean over updates)")
    ax1.set_ylabel("AUC gain over GRPO at equal rollouts\n(paired by seed, 95% interval)")
    ax2.axhline(1, color="gray", linewidth=1)
    ax2.set_ylim(0, 2.5)  # three-seed t-intervals of a ratio reach below 0; the axis shows what a ratio can be
    ax2.set_xlabel("GRPO's degenerate-group share (mean over updates)")
    ax2.set_ylabel("GRPO's rollouts to target / method's\n(faint: per-seed targets, 95% interval)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path, default=Path("regime_map"))
    ap.add_argument("--levels", nargs="+", default=LEVELS)
    args = ap.parse_args()
    levels = [level_rows(args.root / lv) for lv in args.levels if (args.root / lv / "compare.json").is_file()]
    if not levels:
        raise SystemExit(f"no compare.json under {args.root} for levels {args.levels}")
    table = to_markdown(levels)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps(levels, indent=2))
    plot(levels, args.out.with_suffix(".png"))
    print(table)


if __name__ == "__main__":
    main()
