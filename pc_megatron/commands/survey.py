"""``pc-megatron survey RECIPE``: the regime of a recipe's pool under its starting policy, in minutes,
before a GPU-hour is spent on it.

1. ``k`` rollouts for each of ``m`` prompts drawn from the training pool, through the recipe's own
   engine and reward (what the run's first step would see).
2. The pool's pass-rate distribution: a population prior on the adaptive allocator's grid of pass
   rates (exact 0 and 1 included; dense near both ends), fitted to the prompts' correct counts by
   EM (``scheduler/belief.py``'s model): prompts never or always solved in ``k`` tries are read
   in the light of the whole pool, not as exact zeros and ones.
3. From it: the expected share of degenerate (all-alike) n-sample groups, at the recipe's n and at
   8, 16, 32, 64; and each allocation policy (grpo, dapo, pilot_commit, adaptive) on a pool of pass
   rates drawn from the fit, with the recipe's B, n and scheduler settings
   (``scheduler/simulate.py``): rollouts generated per informative trained group.
4. Uncertainty: the prompts are resampled (bootstrap), the fit and the simulation redone; intervals
   are the 2.5-97.5 percentiles. The policy with the fewest rollouts per informative group is
   favoured only when its ratio to GRPO's stays below 1 across the bootstrap.

5. Per level (``meta["family"]``): pass@1, pass@8, the share of mixed groups of the recipe's n, and
   with ``math_verify`` the share boxed and the accuracy among boxed answers (``scheduler/regime.py``).
   ``--split eval`` samples the held-out set, ``--model DIR`` a trained checkpoint's Hugging Face
   folder: the skill before and after a run, on the same problems and sampling seeds.

The simulation holds the policy still, so it speaks of a run's first epoch; learning moves the pool.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pc_megatron.commands import add_recipe_arguments, recipe_and_overrides
from pc_megatron.scheduler.belief import GRID
from pc_megatron.scheduler.regime import COSTS, POLICIES, analyse, by_level, degenerate_share, histogram

if TYPE_CHECKING:
    from pc_megatron.config import RunConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("survey", help="a recipe's pool under its starting policy: pass rates, degenerate groups")
    add_recipe_arguments(p)
    p.add_argument("--prompts", type=int, default=128, help="training prompts sampled")
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="rollouts per prompt (default: the recipe's n, at least 16; fewer than n cannot resolve the pass "
        "rates below 1/k that decide whether an n-sample group is all alike)",
    )
    p.add_argument("--steps", type=int, default=40, help="steps of each policy simulated on the fitted pool")
    p.add_argument("--bootstrap", type=int, default=20, help="resamples of the prompts for the intervals")
    p.add_argument(
        "--split",
        choices=("train", "eval"),
        default="train",
        help="prompts from the training pool (what the first step sees) or the held-out set (the skill before "
        "and after a run, with --model)",
    )
    p.add_argument(
        "--model",
        metavar="DIR",
        help="sample from this Hugging Face folder (e.g. a run's `convert --to hf` output) instead of the recipe's "
        "starting policy",
    )
    p.add_argument("--out", metavar="DIR", help="write survey.json here")
    p.add_argument(
        "--load",
        metavar="FILE",
        help="a saved survey.json instead of sampling again: printed as saved, or with RECIPE [overrides] "
        "forecast again from its per-prompt counts under that setting (another n, B or scheduler)",
    )
    p.add_argument(
        "--against", nargs="+", metavar="RUN", help="runs of the recipe: their first --steps steps beside the forecast"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config
    from pc_megatron.errors import ConfigError

    if args.load:
        res = json.loads(Path(args.load).read_text())
        if args.recipe:  # forecast again from the saved counts under this recipe and its overrides
            if "correct" not in res:
                raise ConfigError(
                    f"{args.load} was saved without per-prompt counts (before they were kept): run the survey "
                    "again to forecast under another setting, or drop the recipe to print it as saved"
                )
            cfg = load_config(*recipe_and_overrides(args))
            kept = {k: res[k] for k in ("rollouts", "tokens", "wall_s", "split", "model", "by_level") if k in res}
            res = forecast(res["correct"], res["samples"], cfg, args.steps, args.bootstrap, kept)
    else:
        cfg = load_config(*recipe_and_overrides(args))
        out = Path(args.out) if args.out else None
        res = survey(cfg, args.prompts, args.samples, out, args.steps, args.bootstrap, args.split, args.model)
    print(format_survey(res))
    if args.against:
        steps = res["recipe"]["steps_simulated"]
        print(format_against(res, [observed(Path(r), steps) for r in args.against]))
    return 0


def survey(
    cfg: RunConfig,
    prompts: int,
    samples: int | None,
    out: Path | None,
    steps: int = 40,
    boots: int = 20,
    split: str = "train",
    model: str | None = None,
) -> dict:
    """``samples`` None: the recipe's n, at least 16. ``split``: the pool the prompts come from
    (``train`` or ``eval``); ``model``: a Hugging Face folder sampled instead of the recipe's
    starting policy."""
    import torch

    if samples is None:
        samples = max(16, cfg.algo.samples_per_prompt)

    from pc_megatron.rewards.pool import RewardPool
    from pc_megatron.rollout.engines import build_engine
    from pc_megatron.rollout.generate import encode_prompts, generate_and_score
    from pc_megatron.run.prepare import prepare_run

    t0 = time.time()
    from pc_megatron.runtime.resources import resolve_run

    cfg, resolved = resolve_run(cfg)  # the run's own dtype, threads and engine binding on this machine
    torch.set_num_threads(cfg.threads)
    prepared = prepare_run(cfg, progress=cfg.progress)
    pool = prepared.task.train if split == "train" else prepared.task.eval
    rows = random.Random(cfg.seed).sample(pool, min(prompts, len(pool)))
    rc = cfg.rollout
    if model is not None and not (Path(model) / "config.json").is_file():
        from pc_megatron.errors import ConfigError

        raise ConfigError(f"survey --model {model}: no config.json there; give a Hugging Face model folder")
    engine = build_engine(
        rc,
        Path(model) if model else prepared.policy_dir,
        learner_bf16=cfg.learner.bf16,
        cpu_cores=resolved.threads.engine_cores,
    )
    try:
        with RewardPool(cfg.reward) as rewards:
            tok = prepared.tokenizer
            completions, scored = generate_and_score(
                engine, tok, rewards, rows, encode_prompts(tok, rows), samples, rc.sampling(), cfg.seed
            )
    finally:
        engine.close()
    correct = [0] * len(rows)
    boxed = [0] * len(rows)
    for c, res in zip(completions, scored.results, strict=True):
        correct[c.prompt_index] += int(res.correct)
    if cfg.reward.name == "math_verify":
        from pc_megatron.rewards.math import last_boxed

        texts = tok.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
        for c, text in zip(completions, texts, strict=True):
            boxed[c.prompt_index] += last_boxed(text) is not None
    sampled = {
        "rollouts": len(completions),
        "tokens": sum(len(c.token_ids) for c in completions),
        "split": split,
        "model": str(model or prepared.policy_dir),
        "by_level": by_level(
            rows, correct, boxed if cfg.reward.name == "math_verify" else None, samples, cfg.algo.samples_per_prompt
        ),
    }
    result = forecast(correct, samples, cfg, steps, boots, sampled)
    result["wall_s"] = time.time() - t0
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "survey.json").write_text(json.dumps(result, indent=2))
    return result


def forecast(correct: list[int], samples: int, cfg: RunConfig, steps: int, boots: int, sampled: dict) -> dict:
    """The survey's figures from per-prompt correct counts (of ``samples`` each) under ``cfg``'s
    scheduler, B and n: what ``survey`` prints, and what ``--load FILE RECIPE`` recomputes from a saved
    survey's counts (another n, B or scheduler setting, without sampling again)."""
    counts = [(c, samples) for c in correct]
    sched = cfg.scheduler
    B, n = cfg.algo.prompts_per_step, cfg.algo.samples_per_prompt
    prior, point, intervals, ratios, verdict = analyse(counts, sched, B, n, steps, boots, cfg.seed)
    alike = sum(c in (0, samples) for c in correct) / len(correct)
    return {
        "prompts": len(correct),
        "samples": samples,
        **sampled,
        "mean_pass_rate": sum(correct) / (len(correct) * samples),
        "histogram": histogram(correct, samples),
        "observed_degenerate_at_k": alike,
        "fitted_degenerate_at_k": degenerate_share(prior, samples),
        "prior": dict(zip(map(str, GRID), prior, strict=True)),
        "degenerate": point["degenerate"],
        "degenerate_interval_at_n": intervals["degenerate"],
        "per_informative_group": point["per_informative_group"],
        "per_informative_group_interval": {p: intervals[p] for p in POLICIES},
        "ratio_to_grpo": ratios,
        "ratio_to_grpo_interval": {p: intervals[f"{p}/grpo"] for p in POLICIES},
        "per_update": point["per_update"],
        "per_update_ratio_interval": {p: intervals[f"{p}/grpo per update"] for p in POLICIES},
        "verdict": verdict,
        "recipe": {"B": B, "n": n, "pilot_samples": sched.pilot_samples, "steps_simulated": steps},
        "correct": correct,  # per prompt, of ``samples``: enough to forecast again under another setting
    }


def observed(run_dir: Path, steps: int) -> dict[str, Any]:
    """What a run's first ``steps`` steps measured, in the survey's terms: its policy, the share of
    trained groups that were all alike, rollouts generated per informative (mixed) trained group and
    rollouts generated per update."""
    from pc_megatron.config import read_run_config
    from pc_megatron.run.logs import read_metrics

    policy = read_run_config(run_dir / "config.yaml").scheduler.policy
    rows = [r for r in read_metrics(run_dir) if 0 < r["step"] <= steps and "trained_groups" in r]
    if not rows:
        raise ValueError(f"{run_dir}: no training steps in metrics.jsonl")
    groups = sum(r["trained_groups"] for r in rows)
    alike = sum(r["trained_groups"] * (r["frac_all_correct"] + r["frac_all_wrong"]) for r in rows)
    generated = sum(r["sched/step_generated"] for r in rows)
    return {
        "run": str(run_dir),
        "policy": policy,
        "steps": len(rows),
        "degenerate_trained": alike / groups,
        "per_informative_group": generated / max(groups - alike, 1e-9),
        "per_update": generated / len(rows),
    }


def format_against(res: dict, runs: list[dict]) -> str:
    """The survey's predictions beside what runs measured (the prediction of degenerate groups is for
    GRPO's groups of n; Pilot-Commit trains filtered groups, so only its rollouts compare)."""
    n = res["recipe"]["n"]
    lines = ["predicted against measured (first steps of each run):"]
    for o in runs:
        p = o["policy"]
        a, b = res["per_informative_group_interval"][p]
        deg = ""
        if p == "grpo":
            lo, hi = res["degenerate_interval_at_n"]
            share = {int(m): v for m, v in res["degenerate"].items()}[n]  # JSON keys are strings
            deg = f"; degenerate n={n} groups {share:.2f} ({lo:.2f}-{hi:.2f}) vs {o['degenerate_trained']:.2f}"
        lines.append(
            f"  {p:13s} {o['steps']} steps of {o['run']}: rollouts per informative group "
            f"{res['per_informative_group'][p]:.1f} ({a:.1f}-{b:.1f}) vs {o['per_informative_group']:.1f}{deg}"
        )
    by_policy: dict[str, list[dict]] = {}
    for o in runs:
        by_policy.setdefault(o["policy"], []).append(o)
    if len(runs) > len(by_policy):  # several runs (seeds) of a policy: their mean, and ratios between means
        lines.append("by policy (mean over its runs; the ratio is to grpo's measured mean, forecast in brackets):")
        means = {p: {k: sum(o[k] for o in os) / len(os) for k in COSTS} for p, os in by_policy.items()}
        for p, os in by_policy.items():
            vals = [o["per_informative_group"] for o in os]
            line = (
                f"  {p:13s} {len(os)} runs: {means[p]['per_informative_group']:.1f} ({min(vals):.1f}-{max(vals):.1f}) "
                "rollouts per informative group"
            )
            if "grpo" in means and p != "grpo":
                a, b = res["ratio_to_grpo_interval"][p]
                line += (
                    f"; x grpo {means[p]['per_informative_group'] / means['grpo']['per_informative_group']:.2f} "
                    f"[forecast {res['ratio_to_grpo'][p]:.2f} ({a:.2f}-{b:.2f})]"
                    f"; per update x grpo {means[p]['per_update'] / means['grpo']['per_update']:.2f}"
                )
                if "per_update" in res:  # surveys saved before it was forecast lack it
                    ua, ub = res["per_update_ratio_interval"][p]
                    line += f" [forecast {res['per_update'][p] / res['per_update']['grpo']:.2f} ({ua:.2f}-{ub:.2f})]"
            lines.append(line)
    return "\n".join(lines)


def format_levels(levels: dict[str, dict[str, float]]) -> list[str]:
    keys = list(next(iter(levels.values())))
    lines = ["per level: " + "  ".join(f"{k:>9s}" for k in keys)]
    for fam, fig in levels.items():
        lines.append(f"  {fam:7s} " + "  ".join(f"{fig[k]:9d}" if k == "prompts" else f"{fig[k]:9.3f}" for k in keys))
    return lines


def format_survey(res: dict) -> str:
    n = res["recipe"]["n"]
    lo, hi = res["degenerate_interval_at_n"]
    lines = [
        f"{res['prompts']} prompts x {res['samples']} samples ({res['rollouts']:,} rollouts, {res['tokens']:,} tokens, "
        f"{res['wall_s']:.0f} s): mean pass rate {res['mean_pass_rate']:.3f}",
        "estimated pass rates: " + ", ".join(f"{b} {v:.2f}" for b, v in res["histogram"].items()),
        f"degenerate {res['samples']}-sample groups: observed {res['observed_degenerate_at_k']:.2f}, fitted "
        f"{res['fitted_degenerate_at_k']:.2f}",
        "expected degenerate share of n-sample groups (fitted): "
        + ", ".join(f"n={m}: {v:.2f}" for m, v in res["degenerate"].items())
        + f"  (n={n}: {lo:.2f}-{hi:.2f})",
        f"rollouts per informative group, and per update (B={res['recipe']['B']}, n={n}, first "
        f"{res['recipe']['steps_simulated']} steps, simulated on the fitted pool):",
    ]
    per_update = res.get("per_update")  # surveys saved before it was forecast lack it
    for p in POLICIES:
        a, b = res["ratio_to_grpo_interval"][p]
        line = (
            f"  {p:13s} {res['per_informative_group'][p]:7.1f}   x grpo {res['ratio_to_grpo'][p]:.2f} ({a:.2f}-{b:.2f})"
        )
        if per_update:
            ua, ub = res["per_update_ratio_interval"][p]
            line += f"   | {per_update[p]:6.1f}   x grpo {per_update[p] / per_update['grpo']:.2f} ({ua:.2f}-{ub:.2f})"
        lines.append(line)
    lines.append(f"favoured: {res['verdict']}")
    if res.get("by_level"):
        lines.append(f"{res.get('split', 'train')} prompts, sampled from {res.get('model', 'the starting policy')}:")
        lines.extend(format_levels(res["by_level"]))
    if res["samples"] < n:
        lines.append(
            f"note: {res['samples']} samples a prompt cannot tell a pass rate of 0 from one below 1/{res['samples']}, "
            f"which decides whether a group of {n} is all alike; the forecast at n = {n} extrapolates the fit "
            f"(rerun with --samples {n}: on the embedded task, 16 samples put GRPO's degenerate share at n = 64 "
            "at 0.32 where runs measured 0.42, 64 samples at 0.43)"
        )
    return "\n".join(lines)
