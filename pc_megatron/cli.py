"""``pc-megatron``: train, warmstart, compare, profile, report, survey, score, plan, convert, config show."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path


def _quiet() -> None:
    # Megatron-Core warns at import that TE/Apex are absent; on CPU that is expected.
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
    warnings.filterwarnings("ignore", message=".*Apex is not installed.*")
    warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _train(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config, resume_changes
    from pc_megatron.errors import ConfigError
    from pc_megatron.train import train

    if args.resume:
        run_dir = Path(args.resume)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"{run_dir}: not a run directory (no config.yaml); pass the folder a run created")
        if args.recipe and "=" not in args.recipe:
            raise ConfigError("--resume takes the recipe from RUN_DIR/config.yaml; pass only key=value overrides")
        overrides = ([args.recipe] if args.recipe else []) + args.overrides
        cfg = load_config(str(saved), overrides)
        changes = resume_changes(load_config(str(saved)), cfg)
        done = _checkpoint_step(run_dir)
        if done is not None and done >= cfg.steps:
            print(
                f"{run_dir}: the run is complete (step {done} of {cfg.steps}); nothing to do (raise steps= to train on)"
            )
            return 0
        if changes:
            _log_resume(run_dir, done or 0, changes)
    else:
        recipe, overrides = _recipe_and_overrides(args)
        cfg = load_config(recipe, overrides)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            "pc-megatron train is not launched by torchrun: run it once, with runtime=ray, and Ray places "
            "the learner ranks (learner.tensor_parallel_size / pipeline_parallel_size / data_parallel_size)"
        )
    if not args.resume:
        name = cfg.name or f"{Path(recipe).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = Path(cfg.out_dir) / name
        if (run_dir / "checkpoints").exists():
            raise ConfigError(f"{run_dir} already holds a run; use --resume {run_dir} or another name=")
    print(f"run directory: {run_dir}", flush=True)
    try:
        train(cfg, run_dir, resume=bool(args.resume))
    except KeyboardInterrupt:
        print(
            f"interrupted; resume from the last checkpoint with `pc-megatron train --resume {run_dir}`", file=sys.stderr
        )
        return 130
    return 0


def _checkpoint_step(run_dir: Path) -> int | None:
    from pc_megatron.checkpoint import latest_checkpoint

    folder = latest_checkpoint(run_dir / "checkpoints")
    return int(folder.name.split("_")[-1]) if folder is not None and folder.name.startswith("step_") else None


def _log_resume(run_dir: Path, step: int, changes: dict) -> None:
    """Each accepted change of a resume, with the step it takes effect after, in ``resumes.jsonl``
    (``config.yaml`` is rewritten with the new values when the run starts)."""
    entry = {"after_step": step, "changes": {k: {"was": a, "now": b} for k, (a, b) in changes.items()}}
    with open(run_dir / "resumes.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    print(f"resuming after step {step} with " + ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in changes.items()))


def _warmstart(args: argparse.Namespace) -> int:
    import shutil

    import torch

    from pc_megatron.config import load_config
    from pc_megatron.errors import ConfigError
    from pc_megatron.prepare import prepare_run
    from pc_megatron.warmstart import SHIPPED

    cfg = load_config(*_recipe_and_overrides(args))
    torch.set_num_threads(cfg.threads)
    if not cfg.warmstart.enabled:
        raise ConfigError("this recipe has warmstart.enabled=false: there is no warm-start to run")
    path = prepare_run(cfg, progress=cfg.progress).policy_dir
    if args.ship and path.parent != SHIPPED:
        dest = SHIPPED / path.name
        shutil.copytree(path, dest, dirs_exist_ok=True)
        path = dest
    print(path)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from pc_megatron.compare import compare

    recipe, overrides = _recipe_and_overrides(args)
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


def _profile(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config
    from pc_megatron.profiling import profile

    cfg = load_config(*_recipe_and_overrides(args))
    out = Path(args.out)
    res = profile(cfg, out, args.steps, args.warmup)
    print((out / "breakdown.md").read_text().split("## Top operators")[0].rstrip())
    print(f"\n{out}: trace.json, breakdown.md, breakdown.png (phases = {res['phase_sum_over_step']:.1%} of the step)")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config
    from pc_megatron.plan import format_plan, plan

    res = plan(load_config(*_recipe_and_overrides(args)), gpu_gib=args.gpu_gib)
    print(format_plan(res))
    return 2 if res["problems"] else 0


def _survey(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config
    from pc_megatron.errors import ConfigError
    from pc_megatron.survey import forecast, format_against, format_survey, observed, survey

    if args.load:
        res = json.loads(Path(args.load).read_text())
        if args.recipe:  # forecast again from the saved counts under this recipe and its overrides
            if "correct" not in res:
                raise ConfigError(
                    f"{args.load} was saved without per-prompt counts (before they were kept): run the survey "
                    "again to forecast under another setting, or drop the recipe to print it as saved"
                )
            cfg = load_config(*_recipe_and_overrides(args))
            kept = {k: res[k] for k in ("rollouts", "tokens", "wall_s") if k in res}
            res = forecast(res["correct"], res["samples"], cfg, args.steps, args.bootstrap, kept)
    else:
        cfg = load_config(*_recipe_and_overrides(args))
        res = survey(cfg, args.prompts, args.samples, Path(args.out) if args.out else None, args.steps, args.bootstrap)
    print(format_survey(res))
    if args.against:
        steps = res["recipe"]["steps_simulated"]
        print(format_against(res, [observed(Path(r), steps) for r in args.against]))
    return 0


def _score(args: argparse.Namespace) -> int:
    from pc_megatron.rewards import RewardConfig
    from pc_megatron.rewards.offline import score_file

    cfg = RewardConfig(
        name=args.reward, function=args.function or "", workers=args.workers, timeout_s=args.timeout_s, on_error="count"
    )
    out = Path(args.out) if args.out else None
    summary = score_file(Path(args.file), cfg, out)
    print(json.dumps({"file": args.file, **({"out": args.out} if out else {}), **summary}))
    return 0


def _report(args: argparse.Namespace) -> int:
    from pc_megatron.report import report

    print(report([Path(d) for d in args.run_dirs], Path(args.out)))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from pc_megatron.convert import hf_to_megatron, megatron_to_hf_folder

    if args.to == "megatron":
        res = hf_to_megatron(args.src, args.out, tp=args.tp, pp=args.pp)
    else:
        res = megatron_to_hf_folder(args.src, args.out, max_shard_gb=args.max_shard_gb)
    gb = res["bytes"] / 1e9
    print(f"{args.out}: {gb:.2f} GB in {res['seconds']:.1f} s ({gb / max(res['seconds'], 1e-9):.2f} GB/s)")
    return 0


def _recipe_and_overrides(args: argparse.Namespace) -> tuple[str, list[str]]:
    recipe, overrides = args.recipe or "tiny", list(args.overrides)
    if "=" in recipe:  # `pc-megatron CMD key=value ...` with the default recipe
        recipe, overrides = "tiny", [recipe, *overrides]
    return recipe, overrides


def _config_show(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config, to_yaml

    print(to_yaml(load_config(*_recipe_and_overrides(args))), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    _quiet()
    parser = argparse.ArgumentParser(prog="pc-megatron", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="warm-start (cached) then RL on a recipe")
    p_train.add_argument("recipe", nargs="?", help="recipe name in configs/ or a YAML path (default: tiny)")
    p_train.add_argument("overrides", nargs="*", help="key=value overrides, e.g. learner.lr=1e-4")
    p_train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p_train.set_defaults(func=_train)
    p_ws = sub.add_parser("warmstart", help="run (or find) the SFT warm-start of a recipe and print its folder")
    p_ws.add_argument("recipe", nargs="?")
    p_ws.add_argument("overrides", nargs="*")
    p_ws.add_argument("--ship", action="store_true", help="copy it into the package's shipped warm-starts")
    p_ws.set_defaults(func=_warmstart)
    p_cmp = sub.add_parser("compare", help="run policies on one recipe at several seeds; rollouts to target")
    p_cmp.add_argument("recipe", nargs="?")
    p_cmp.add_argument("overrides", nargs="*")
    p_cmp.add_argument("--out", required=True, metavar="DIR", help="output folder (one run directory per method)")
    p_cmp.add_argument("--methods", nargs="+", default=["grpo", "dapo", "pilot_commit"])
    p_cmp.add_argument("--target", type=float, help="accuracy target (default: the best of GRPO's seed-mean curve)")
    p_cmp.add_argument("--seeds", type=int, nargs="+", help="run every method at each seed (default: the recipe's)")
    p_cmp.add_argument("--jobs", type=int, default=1, help="runs at a time (threads are split between them)")
    p_cmp.add_argument(
        "--fraction",
        type=float,
        default=0.5,
        help="paired figure: rollouts to reach this share of the best method's gain (default 0.5; "
        "0.9 reads how fast a curve that levels off gets near its level)",
    )
    p_cmp.add_argument(
        "--method-overrides",
        nargs="+",
        action="append",
        metavar="METHOD KEY=VALUE",
        help="overrides for one method's runs only (repeatable), e.g. --method-overrides pilot_commit steps=4 "
        "eval.every_steps=1: the same rollouts for methods whose rollouts per step differ",
    )
    p_cmp.set_defaults(func=_compare)
    p_prof = sub.add_parser("profile", help="torch.profiler over a few steps: trace, per-phase breakdown, memory")
    p_prof.add_argument("recipe", nargs="?")
    p_prof.add_argument("overrides", nargs="*")
    p_prof.add_argument("--steps", type=int, default=3, help="profiled steps")
    p_prof.add_argument("--warmup", type=int, default=2, help="steps run before profiling starts")
    p_prof.add_argument("--out", required=True, metavar="DIR", help="folder for trace.json, breakdown.md/png")
    p_prof.set_defaults(func=_profile)
    p_plan = sub.add_parser("plan", help="per-GPU memory and per-step work of a recipe; refuses what cannot fit")
    p_plan.add_argument("recipe", nargs="?")
    p_plan.add_argument("overrides", nargs="*")
    p_plan.add_argument("--gpu-gib", type=float, default=140.0, help="memory of one GPU (H200: 140 GiB)")
    p_plan.set_defaults(func=_plan)
    p_sv = sub.add_parser("survey", help="a recipe's pool under its starting policy: pass rates, degenerate groups")
    p_sv.add_argument("recipe", nargs="?")
    p_sv.add_argument("overrides", nargs="*")
    p_sv.add_argument("--prompts", type=int, default=128, help="training prompts sampled")
    p_sv.add_argument(
        "--samples",
        type=int,
        default=None,
        help="rollouts per prompt (default: the recipe's n, at least 16; fewer than n cannot resolve the pass "
        "rates below 1/k that decide whether an n-sample group is all alike)",
    )
    p_sv.add_argument("--steps", type=int, default=40, help="steps of each policy simulated on the fitted pool")
    p_sv.add_argument("--bootstrap", type=int, default=20, help="resamples of the prompts for the intervals")
    p_sv.add_argument("--out", metavar="DIR", help="write survey.json here")
    p_sv.add_argument(
        "--load",
        metavar="FILE",
        help="a saved survey.json instead of sampling again: printed as saved, or with RECIPE [overrides] "
        "forecast again from its per-prompt counts under that setting (another n, B or scheduler)",
    )
    p_sv.add_argument(
        "--against", nargs="+", metavar="RUN", help="runs of the recipe: their first --steps steps beside the forecast"
    )
    p_sv.set_defaults(func=_survey)
    p_sc = sub.add_parser("score", help="score a JSONL of id/completion/answer rows with a reward, offline")
    p_sc.add_argument("file", help="JSONL rows with id, completion, answer")
    p_sc.add_argument("--reward", default="math_verify", help="registered reward name (default: math_verify)")
    p_sc.add_argument("--function", help="or a reward function as module:function")
    p_sc.add_argument("--out", metavar="OUT", help="write the rows with score and correct here (JSONL)")
    p_sc.add_argument("--workers", type=int, default=2, help="reward worker processes")
    p_sc.add_argument("--timeout-s", type=float, default=10.0, help="per-completion deadline")
    p_sc.set_defaults(func=_score)
    p_rep = sub.add_parser("report", help="one Markdown page of plots from the metrics of one or several runs")
    p_rep.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p_rep.add_argument("--out", required=True, metavar="DIR", help="folder for report.md and its PNGs")
    p_rep.set_defaults(func=_report)
    p_cv = sub.add_parser("convert", help="HF <-> Megatron tensor-parallel shards (see pc_megatron/convert.py)")
    p_cv.add_argument("--to", required=True, choices=["hf", "megatron"])
    p_cv.add_argument("src", help="HF folder (--to megatron); shard folder, checkpoint or run directory (--to hf)")
    p_cv.add_argument("out", help="output folder (must not exist; written atomically)")
    p_cv.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the shards (--to megatron)")
    p_cv.add_argument("--pp", type=int, default=1, help="pipeline-parallel size of the shards (--to megatron)")
    p_cv.add_argument("--max-shard-gb", type=float, default=2.0, help="largest output safetensors file (--to hf)")
    p_cv.set_defaults(func=_convert)
    p_cfg = sub.add_parser("config", help="config tools")
    cfg_sub = p_cfg.add_subparsers(dest="config_command", required=True)
    p_show = cfg_sub.add_parser("show", help="print the resolved config")
    p_show.add_argument("recipe", nargs="?")
    p_show.add_argument("overrides", nargs="*")
    p_show.set_defaults(func=_config_show)
    args = parser.parse_args(argv)

    from pc_megatron.errors import UserError
    from pc_megatron.preemption import RunStopped

    try:
        return args.func(args)
    except RunStopped as e:
        print(str(e), file=sys.stderr)
        return 128 + e.signum
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
