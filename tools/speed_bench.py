"""Update cost of recipes side by side: each variant a ``pc-megatron train`` run of a few updates, one
after the other on the same machine (never two at once: two torch jobs on two cores slow each other far
more than twice), then the figures per variant and their ratios to the first.

    python tools/speed_bench.py --out runs/speed --steps 6 \\
        --variant shipped@d94a7eb:smollm2-arith --variant now:smollm2-arith \\
        -- eval.num_prompts=50 eval.every_steps=1000 checkpoint.every_steps=1000

A variant is ``NAME[@REV]:RECIPE[,key=value,...]``: with ``@REV`` the run uses the package and the
recipes of that git revision (a worktree in ``OUT/src/REV``), so a recipe "as shipped" then is what
runs; the overrides after ``--`` go to every variant (same B x n, token limits, held-out set). The
cache (model conversion, warm-start) is shared. ``--rounds R`` repeats the variants in turn (ABAB).

Equal updates, accuracy too: ``--steps 0`` runs each recipe for its own number of steps with its own
held-out evaluations, and ``--seeds 0 1 2`` runs every variant once per seed (``seed=S``; in turn, seed
by seed), so a variant's held-out accuracy at each evaluation is compared with the first variant's,
paired by seed (mean difference and its 95% t-interval over the seeds):

    python tools/speed_bench.py --out runs/equal --steps 0 --seeds 0 1 2 \\
        --variant shipped@d94a7eb:smollm2-arith --variant now:smollm2-arith

Per variant: the median wall time of an update (every step but the first, whose figures carry
start-up), its phases, the generated and trained tokens per second of step time (tokens, so that
shorter answers do not pass for speed) and the mean answer length; with evaluations, held-out strict
accuracy and accuracy among boxed answers at each. Writes ``OUT/speed_bench.json`` and ``OUT/speed_bench.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pc_megatron.run.logs import read_metrics  # noqa: E402
from pc_megatron.stats import format_interval, interval  # noqa: E402

PHASES = ("rollout", "reward", "logprob", "train", "optimizer", "sync")


def parse_variant(text: str) -> tuple[str, str | None, str, list[str]]:
    head, _, spec = text.partition(":")
    name, _, rev = head.partition("@")
    recipe, *overrides = spec.split(",")
    return name, rev or None, recipe, overrides


def source_dir(out: Path, rev: str | None) -> Path:
    """The checkout a variant runs: this one, or a worktree of ``rev``."""
    if rev is None:
        return ROOT
    where = out / "src" / rev
    if not where.is_dir():
        where.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True)
    return where


def run(out: Path, variant: str, where: str, seed: int | None, steps: int, common: list[str]) -> Path:
    """One variant's run in ``OUT/<where>/<name>`` (with ``seed=S`` unless ``seed`` is None); a run with its
    ``summary.json`` is not run again. ``steps`` 0: the recipe's own."""
    name, rev, recipe, overrides = parse_variant(variant)
    run_dir = out / where / name
    if (run_dir / "summary.json").is_file():
        return run_dir
    src = source_dir(out, rev)
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "pc_megatron.cli", "train", recipe, *overrides, *common]
    cmd += [f"steps={steps}"] if steps else []
    cmd += [f"seed={seed}"] if seed is not None else []
    cmd += ["progress=false", f"out_dir={run_dir.parent}", f"name={run_dir.name}"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{name} {where}] {' '.join(cmd[3:])}  (code: {src})", flush=True)
    with open(run_dir.parent / f"{name}.log", "w") as log:
        subprocess.run(cmd, env=env, cwd=src, stdout=log, stderr=subprocess.STDOUT, check=True)
    return run_dir


def figures(run_dirs: list[Path]) -> dict:
    rows = [r for d in run_dirs for r in read_metrics(d) if r["step"] >= 2]
    step_s = [r["time_step_s"] for r in rows]
    generated = sum(r["generated_tokens"] for r in rows)
    trained = sum(r["sched/step_tokens_trained"] for r in rows)
    total_s = sum(step_s)
    return {
        "updates": len(rows),
        "median_update_s": statistics.median(step_s),
        "min_update_s": min(step_s),
        "max_update_s": max(step_s),
        "phases_s": {p: statistics.median(r.get(f"time_{p}_s", 0.0) for r in rows) for p in PHASES},
        "tokens_per_s": (generated + trained) / total_s,
        "generated_tokens_per_s": generated / total_s,
        "response_len_mean": statistics.mean(r["response_len_mean"] for r in rows),
        "logprob_mismatch_max": max(r.get("logprob_mismatch_max", 0.0) for r in rows),
    }


def heldout(run_dir: Path) -> dict[int, dict[str, float]]:
    """A run's held-out evaluations: step -> strict accuracy, boxed share, accuracy among boxed answers."""
    out = {}
    for r in read_metrics(run_dir):
        if "eval_accuracy" in r:
            acc, boxed = r["eval_accuracy"], r.get("eval_boxed_frac")
            among = acc / boxed if boxed else None
            out[r["step"]] = {"strict": acc, "boxed": boxed, "among_boxed": among}
    return out


def heldout_report(variants: list[str], evals: dict[str, dict[str, dict]]) -> list[str]:
    """Per evaluation step: each variant's held-out figures (mean over seeds) and, against the first
    variant, the difference paired by seed with its 95% t-interval (points)."""
    names = [parse_variant(v)[0] for v in variants]
    base = evals[names[0]]
    runs = sorted(set.intersection(*(set(evals[n]) for n in names)))
    steps = sorted(set.intersection(*(set(evals[n][r]) for n in names for r in runs))) if runs else []
    if not steps:
        return []
    lines = [
        "",
        f"Held-out accuracy at equal updates ({len(runs)} run(s) a variant: {', '.join(runs)}; points against "
        f"`{names[0]}`, paired by run, mean and 95% t-interval):",
        "",
        "| step | variant | strict accuracy | vs first | boxed | accuracy among boxed | vs first |",
        "|---|---|---|---|---|---|---|",
    ]
    for step in steps:
        for name in names:
            figs = [evals[name][r][step] for r in runs]
            cells = []
            for key in ("strict", "boxed", "among_boxed"):
                cells.append(format_interval(interval([f[key] for f in figs if f[key] is not None]), ".3f"))
                if key != "boxed":
                    diff = [
                        100 * (f[key] - base[r][step][key])
                        for f, r in zip(figs, runs, strict=True)
                        if f[key] is not None and base[r][step][key] is not None
                    ]
                    cells.append("" if name == names[0] else format_interval(interval(diff), "+.1f"))
            lines.append(f"| {step} | `{name}` | " + " | ".join(cells) + " |")
    return lines


def report(out: Path, variants: list[str], results: dict, common: list[str], evals: dict | None = None) -> str:
    base = results[parse_variant(variants[0])[0]]
    lines = [
        f"Overrides for every variant: {' '.join(f'`{c}`' for c in common) or 'none'}",
        "",
        "| variant | updates | median update (min-max) | vs first | tokens/s (gen + trained) | vs first | "
        "answer length | " + " | ".join(PHASES) + " | max log-prob mismatch |",
        "|---|---|---|---|---|---|---|" + "---|" * len(PHASES) + "---|",
    ]
    for variant in variants:
        name = parse_variant(variant)[0]
        f = results[name]
        lines.append(
            f"| `{variant}` | {f['updates']} | {f['median_update_s']:.1f} s ({f['min_update_s']:.1f}-"
            f"{f['max_update_s']:.1f}) | {f['median_update_s'] / base['median_update_s']:.2f}x | "
            f"{f['tokens_per_s']:.0f} | {f['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
            f"{f['response_len_mean']:.1f} | "
            + " | ".join(f"{f['phases_s'][p]:.1f}" for p in PHASES)
            + f" | {f['logprob_mismatch_max']:.3g} |"
        )
    lines += heldout_report(variants, evals or {})
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variant", action="append", required=True, help="NAME[@REV]:RECIPE[,key=value,...]")
    ap.add_argument("--steps", type=int, default=6, help="updates a run (0: the recipe's own, with its evaluations)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seeds", type=int, nargs="+", help="one round a seed (seed=S), instead of --rounds")
    ap.add_argument("common", nargs="*", help="overrides for every variant (after --)")
    args = ap.parse_args()
    args.out = args.out.resolve()  # the runs start in their own checkout
    if args.seeds and args.rounds != 1:
        ap.error("--seeds runs one round a seed: leave --rounds out")
    rounds = [(f"seed{s}", s) for s in args.seeds] if args.seeds else [(f"round{r}", None) for r in range(args.rounds)]
    dirs: dict[str, list[Path]] = {}
    for where, seed in rounds:
        for variant in args.variant:
            run_dir = run(args.out, variant, where, seed, args.steps, args.common)
            dirs.setdefault(parse_variant(variant)[0], []).append(run_dir)
    results = {name: figures(d) for name, d in dirs.items()}
    evals = {name: {d.parent.name: heldout(d) for d in ds} for name, ds in dirs.items()}
    (args.out / "speed_bench.json").write_text(json.dumps({**results, "heldout": evals}, indent=2))
    text = report(args.out, args.variant, results, args.common, evals)
    (args.out / "speed_bench.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
