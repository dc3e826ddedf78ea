"""η against η: the same recipe, placement and seeds at several ``rollout.max_staleness`` values (or any
variants), one run at a time (so that wall times compare), then the figures side by side.

    python tools/async_bench.py --out runs/async --seeds 0 1 2 --etas 0 1 -- tiny runtime=ray \\
        ray.placement=split rollout.backend=vllm threads=1
    python tools/async_bench.py --out runs/ctl --seeds 0 1 2 --variants \\
        tis:rollout.max_staleness=4,algo.loss.correction=tis \\
        none:rollout.max_staleness=4,algo.loss.correction=none -- tiny
    python tools/async_bench.py --out runs/async --etas 0 1 --report   # the figures of the runs already made

Each run is ``pc-megatron train RECIPE [overrides] <the variant's overrides> seed=S`` in
``OUT/seed<S>/<variant>/`` (``--etas E``: variants ``etaE`` = ``rollout.max_staleness=E``; a finished
run is reused, a cut one resumed, so the command can be repeated). The first variant is the base.
Per η: the median wall time per update (every step but the first, whose figures carry start-up; eval
steps included, as in a run), the time in each of the loop's phases, how much of each step the learner
and the engines were busy (``time/learner_busy_s``, ``time/engine_busy_s``), the largest staleness of
a trained token, and the correction's figures; against the first η, the per-seed ratio of median step
times (interval over seeds, geometric) and held-out accuracy against rollouts, paired by seed
(``pc_megatron.stats.paired``). Writes ``OUT/async_bench.json`` and ``OUT/async_bench.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pc_megatron.run.logs import read_metrics  # noqa: E402
from pc_megatron.stats import curve, format_interval, paired, paired_markdown, ratio_interval  # noqa: E402

PHASES = (
    "wait_rollout",
    "scheduler",
    "rollout",
    "reward",
    "engine_wait",
    "logprob",
    "train",
    "optimizer",
    "sync",
    "eval",
)


def run(out: Path, recipe: list[str], name: str, overrides: list[str], seed: int) -> Path:
    run_dir = out / f"seed{seed}" / name
    if (run_dir / "summary.json").is_file():
        return run_dir
    common = [*overrides, f"seed={seed}", "progress=false"]
    if (run_dir / "checkpoints" / "latest").is_file():
        cmd = ["train", "--resume", str(run_dir), "progress=false"]
    else:
        cmd = ["train", *recipe, *common, f"out_dir={run_dir.parent}", f"name={run_dir.name}"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{name}.log", "a") as log:
        print(f"{name} seed {seed}: pc-megatron {' '.join(cmd)}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pc_megatron.cli", *cmd], check=True, stdout=log, stderr=subprocess.STDOUT
        )
    return run_dir


def figures(rows: list[dict]) -> dict:
    steps = [r for r in rows if r.get("step", 0) >= 2 and "time_step_s" in r]
    step_s = [r["time_step_s"] for r in steps]
    total = sum(step_s)
    return {
        "steps": len(steps),
        "median_step_s": statistics.median(step_s),
        "steps_wall_s": total,
        "phase_share": {p: sum(r.get(f"time_{p}_s", 0.0) for r in steps) / total for p in PHASES},
        "phase_median_s": {p: statistics.median(r.get(f"time_{p}_s", 0.0) for r in steps) for p in PHASES},
        "learner_busy_frac": sum(r.get("time/learner_busy_s", 0.0) for r in steps) / total,
        "engine_busy_frac": sum(r.get("time/engine_busy_s", 0.0) for r in steps) / total,
        "staleness_max": max((r.get("rollout/staleness_max", 0) for r in steps), default=0),
        "staleness_mean": statistics.mean(r.get("rollout/staleness_mean", 0.0) for r in steps),
        "correction_weight_mean": statistics.mean(r.get("correction/weight_mean", 1.0) for r in steps),
        "correction_clipped_frac": statistics.mean(r.get("correction/clipped_frac", 0.0) for r in steps),
        "correction_ess": statistics.mean(r.get("correction/ess", 1.0) for r in steps),
        "cum_rollouts": rows[-1]["cum_rollouts"],
    }


def report(out: Path, etas: list[str], seeds: list[int]) -> dict:
    """The figures of every (variant, seed) run: ``etas`` are the variants' names, the first the base."""
    rows = {(e, s): read_metrics(out / f"seed{s}" / e) for e in etas for s in seeds}
    key = (
        "eval_expected_accuracy"
        if all(any("eval_expected_accuracy" in r for r in v) for v in rows.values())
        else "eval_accuracy"
    )
    per = {(e, s): figures(v) for (e, s), v in rows.items()}
    base = etas[0]
    result: dict = {
        "etas": etas,
        "seeds": seeds,
        "metric": key,
        "per_eta": {},
        "per_run": {f"{e}/seed{s}": f for (e, s), f in per.items()},
    }
    for e in etas:
        runs = [per[e, s] for s in seeds]
        result["per_eta"][e] = {
            "median_step_s": statistics.mean(r["median_step_s"] for r in runs),
            "step_time_ratio_to_base": ratio_interval(
                [per[base, s]["median_step_s"] / per[e, s]["median_step_s"] for s in seeds]
            ),
            "learner_busy_frac": statistics.mean(r["learner_busy_frac"] for r in runs),
            "engine_busy_frac": statistics.mean(r["engine_busy_frac"] for r in runs),
            "staleness_max": max(r["staleness_max"] for r in runs),
            "staleness_mean": statistics.mean(r["staleness_mean"] for r in runs),
            "phase_share": {p: statistics.mean(r["phase_share"][p] for r in runs) for p in PHASES},
            "phase_median_s": {p: statistics.mean(r["phase_median_s"][p] for r in runs) for p in PHASES},
            "correction_clipped_frac": statistics.mean(r["correction_clipped_frac"] for r in runs),
            "correction_ess": statistics.mean(r["correction_ess"] for r in runs),
        }
    curves = {(e, s): curve(rows[e, s], key) for e in etas for s in seeds}
    if len(etas) > 1:
        result["paired"] = paired(curves, tuple(etas), tuple(seeds), base=base)
    (out / "async_bench.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "async_bench.md").write_text(markdown(result))
    return result


def markdown(result: dict) -> str:
    lines = [
        f"Seeds {result['seeds']}; metric `{result['metric']}`. Step time: the median over a run's steps 2.., "
        "mean over seeds; speed-up: the first variant's median over this one's (> 1: faster), geometric over seeds.",
        "",
        "| variant | median step (s) | speed-up | learner busy | engines busy | staleness max / mean | "
        "capped or masked | ESS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e, r in result["per_eta"].items():
        lines.append(
            f"| {e} | {r['median_step_s']:.2f} | {format_interval(r['step_time_ratio_to_base'], '.2f')} | "
            f"{r['learner_busy_frac']:.0%} | {r['engine_busy_frac']:.0%} | {r['staleness_max']} / "
            f"{r['staleness_mean']:.2f} | {r['correction_clipped_frac']:.2%} | {r['correction_ess']:.3f} |"
        )
    lines += ["", "Share of the step in each phase of the loop:", "", "| variant | " + " | ".join(PHASES) + " |"]
    lines += ["|---|" + "---|" * len(PHASES)]
    for e, r in result["per_eta"].items():
        lines.append(f"| {e} | " + " | ".join(f"{r['phase_share'][p]:.0%}" for p in PHASES) + " |")
    lines += ["", "Median seconds of each phase in a step (mean over seeds):", ""]
    lines += ["| variant | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES)]
    for e, r in result["per_eta"].items():
        lines.append(f"| {e} | " + " | ".join(f"{r['phase_median_s'][p]:.3f}" for p in PHASES) + " |")
    if "paired" in result:
        lines += ["", paired_markdown(result["paired"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--etas", type=int, nargs="+", default=[0, 1], help="variants etaE: rollout.max_staleness=E")
    ap.add_argument("--variants", nargs="+", metavar="NAME:KEY=VALUE,...", help="instead of --etas")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--report", action="store_true", help="only the figures of the runs already made")
    ap.add_argument("recipe", nargs="*", help="RECIPE [key=value ...] (after --)")
    args = ap.parse_args()
    if args.variants:
        variants = {v.split(":", 1)[0]: v.split(":", 1)[1].split(",") for v in args.variants}
    else:
        variants = {f"eta{e}": [f"rollout.max_staleness={e}"] for e in args.etas}
    if not args.report:
        for seed in args.seeds:
            for name, overrides in variants.items():
                run(args.out, args.recipe or ["tiny"], name, overrides, seed)
    print(markdown(report(args.out, list(variants), args.seeds)))


if __name__ == "__main__":
    main()
