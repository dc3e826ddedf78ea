"""The paper's confound (#25, item 2) from the two folders `tools/regime_map.sh OUT confound` writes:
Pilot-Commit with mini-batches of 2 prompts (as many optimizer steps per update as GRPO) and with
mini-batches sized in rollouts from the commit size (the public recipe's sizing: more steps), beside
one GRPO run per seed (shared by both folders).

    python tools/confound_report.py runs/map [--out docs/results/confound]

The figure is the recipe's sizing against equal steps, paired by seed at equal rollouts: AUC gain,
accuracy gain at B, and the rollouts ratio to the equal-steps run's final accuracy (compare.paired,
with Pilot-Commit at equal steps as the base). Each sizing against GRPO is printed beside it, so the
share of Pilot-Commit's gain that the extra steps carry can be read off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pc_megatron.run.logs import read_metrics
from pc_megatron.stats import curve, paired, paired_markdown

RUNS = {
    "grpo": ("confound-equal", "grpo"),
    "pc_equal": ("confound-equal", "pilot_commit"),
    "pc_recipe": ("confound-recipe", "pilot_commit"),
}


def report(root: Path) -> dict:
    seeds = json.loads((root / "confound-equal" / "compare.json").read_text())["seeds"]
    recipe_seeds = json.loads((root / "confound-recipe" / "compare.json").read_text())["seeds"]
    if sorted(seeds) != sorted(recipe_seeds):
        raise SystemExit(f"the two folders ran different seeds ({seeds} against {recipe_seeds}): rerun the level")
    runs = {(k, s): read_metrics(root / folder / f"seed{s}" / m) for k, (folder, m) in RUNS.items() for s in seeds}
    key = next(k for k in ("eval_expected_accuracy", "eval_accuracy") if all(curve(r, k) for r in runs.values()))
    curves = {ks: curve(r, key) for ks, r in runs.items()}
    per_update = {
        k: {
            "optimizer_steps": statistics.mean(
                statistics.mean(r["learner/optimizer_steps"] for r in runs[k, s] if "learner/optimizer_steps" in r)
                for s in seeds
            ),
            "rollouts": statistics.mean(runs[k, s][-1]["cum_rollouts"] / runs[k, s][-1]["step"] for s in seeds),
        }
        for k in RUNS
    }
    return {
        "seeds": seeds,
        "metric": key,
        "per_update": per_update,
        "recipe_vs_equal": paired(curves, ("pc_recipe",), tuple(seeds), base="pc_equal"),
        "vs_grpo": paired(curves, ("pc_equal", "pc_recipe"), tuple(seeds), base="grpo"),
    }


def to_markdown(res: dict) -> str:
    lines = [
        f"Seeds {', '.join(map(str, res['seeds']))}; accuracy: {res['metric']}.",
        "",
        "| run | optimizer steps per update | rollouts per update |",
        "|---|---|---|",
    ]
    for k, v in res["per_update"].items():
        lines.append(f"| {k} | {v['optimizer_steps']:.2f} | {v['rollouts']:,.0f} |")
    lines += ["", "The recipe's sizing against equal steps:", "", paired_markdown(res["recipe_vs_equal"]), ""]
    lines += ["Each against GRPO:", "", paired_markdown(res["vs_grpo"]), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="the OUT of tools/regime_map.sh")
    ap.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    args = ap.parse_args()
    res = report(args.root)
    text = to_markdown(res)
    print(text)
    if args.out:
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
