"""Run several allocation policies on one recipe and compare rollouts-to-target.

Same model, data, seed, group size and prompts per update for every method; only
``scheduler.policy`` differs. The target is GRPO's best held-out accuracy (as in the paper)
unless given. Writes ``compare.json``, ``compare.md`` and ``compare.png`` into the output folder,
and each method's full run directory beside them.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from pc_megatron.config import load_config
from pc_megatron.observability import eval_curve, plot_accuracy, read_metrics
from pc_megatron.train import train

METHODS = ("grpo", "dapo", "pilot_commit")


def degenerate_at_start(first: dict) -> float | None:
    """Fraction of the groups generated at the first update whose rewards are all equal: the
    full n-sample groups (GRPO, DAPO), else the n_p-sample pilots (Pilot-Commit; a small pilot is
    degenerate more often than an n-sample group of the same prompt)."""
    for phase in ("full", "pilot"):
        groups = first.get(f"sched/step_groups_{phase}", 0)
        if groups:
            return first[f"sched/step_degenerate_{phase}"] / groups
    return None


def summarize(rows: list[dict], target: float) -> dict[str, Any]:
    """Per-method figures from its metrics rows."""
    wall = list(itertools.accumulate(r.get("time_step_s", 0.0) for r in rows))
    evals = [(r, w) for r, w in zip(rows, wall, strict=True) if "eval_accuracy" in r]
    hit = next(((r, w) for r, w in evals if r["eval_accuracy"] >= target), None)
    updates = [r for r in rows if "frac_all_correct" in r]
    first = next((r for r in rows if r.get("step", 0) >= 1), {})
    return {
        "rollouts_to_target": hit[0]["cum_rollouts"] if hit else None,
        "wall_s_to_target": hit[1] if hit else None,
        "step_to_target": hit[0]["step"] if hit else None,
        "peak_eval_accuracy": max(r["eval_accuracy"] for r, _ in evals),
        "final_eval_accuracy": evals[-1][0]["eval_accuracy"],
        "initial_eval_accuracy": evals[0][0]["eval_accuracy"],
        "cum_rollouts": rows[-1]["cum_rollouts"],
        "mean_group_std": sum(r["mean_group_std"] for r in updates) / max(len(updates), 1),
        "degenerate_frac_start": degenerate_at_start(first),
        "updates": len(updates),
        # the scheduler's own decisions as a share of step time (engine and reward calls excluded)
        "scheduler_time_frac": sum(r.get("time_scheduler_s", 0.0) for r in rows) / max(wall[-1], 1e-9),
    }


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def compare(
    recipe: str, overrides: list[str], out: Path, methods: tuple[str, ...] = METHODS, target: float | None = None
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {}
    for i, method in enumerate(methods, start=1):
        print(f"[{i}/{len(methods)}] {method}", flush=True)
        cfg = load_config(recipe, [*overrides, f"scheduler.policy={method}"])
        run_dir = out / method
        train(cfg, run_dir, resume=(run_dir / "checkpoints" / "latest").exists())
        rows[method] = read_metrics(run_dir)
    if target is None:
        if "grpo" not in rows:
            raise ValueError("without --target the target is GRPO's best accuracy: include grpo in --methods")
        target = max(r["eval_accuracy"] for r in rows["grpo"] if "eval_accuracy" in r)
    result: dict[str, Any] = {"recipe": recipe, "overrides": overrides, "target_eval_accuracy": target}
    result["methods"] = {m: summarize(r, target) for m, r in rows.items()}
    per = result["methods"]
    for other in ("grpo", "dapo"):
        if "pilot_commit" in per and other in per:
            result[f"pilot_commit_vs_{other}"] = ratio(
                per[other]["rollouts_to_target"], per["pilot_commit"]["rollouts_to_target"]
            )
    (out / "compare.json").write_text(json.dumps(result, indent=2))
    (out / "compare.md").write_text(to_markdown(result))
    plot_accuracy({m: eval_curve(r) for m, r in rows.items()}, out / "compare.png", target=target)
    print(to_markdown(result))
    return result


def _fmt(v: Any, spec: str = "") -> str:
    return "not reached" if v is None else format(v, spec)


def to_markdown(result: dict) -> str:
    lines = [
        f"Target held-out accuracy: {result['target_eval_accuracy']:.3f}",
        "",
        "| method | rollouts to target | wall s to target | peak acc | final acc | mean group std "
        "| degenerate at start |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, s in result["methods"].items():
        lines.append(
            f"| {m} | {_fmt(s['rollouts_to_target'], ',')} | {_fmt(s['wall_s_to_target'], '.0f')} | "
            f"{s['peak_eval_accuracy']:.3f} | {s['final_eval_accuracy']:.3f} | {s['mean_group_std']:.3f} | "
            f"{_fmt(s['degenerate_frac_start'], '.2f')} |"
        )
    for key in ("pilot_commit_vs_grpo", "pilot_commit_vs_dapo"):
        if key in result:
            value = "target not reached" if result[key] is None else f"{result[key]:.2f}x"
            lines.append(f"\n{key} (rollouts to target): {value}")
    return "\n".join(lines) + "\n"
