"""``pc-megatron train [RECIPE] [key=value ...]`` and ``--resume RUN_DIR``: the RL run (its loop is
``pc_megatron/train.py``); a resume continues from the latest checkpoint with the keys a resume may
change (``config.RESUME_SAFE``), each change logged in ``resumes.jsonl``."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

from pc_megatron.commands import add_recipe_arguments, recipe_and_overrides


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="warm-start (cached) then RL on a recipe")
    add_recipe_arguments(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config, resume_changes
    from pc_megatron.errors import ConfigError
    from pc_megatron.train import train

    accepted = None
    if args.resume:
        run_dir = Path(args.resume)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"{run_dir}: not a run directory (no config.yaml); pass the folder a run created")
        if not saved.read_text().strip():
            raise ConfigError(
                f"{saved} is empty (a write cut short): restore it (the run's settings are also in "
                "checkpoints/step_*/; resuming on the default config would train another run)"
            )
        if args.recipe and "=" not in args.recipe:
            raise ConfigError("--resume takes the recipe from RUN_DIR/config.yaml; pass only key=value overrides")
        overrides = ([args.recipe] if args.recipe else []) + args.overrides
        cfg = load_config(str(saved), overrides)
        changes = resume_changes(load_config(str(saved)), cfg)
        done = checkpoint_step(run_dir)
        if done is not None and done >= cfg.steps:
            print(
                f"{run_dir}: the run is complete (step {done} of {cfg.steps}); nothing to do (raise steps= to train on)"
            )
            return 0
        if changes:  # logged once the run holds its folder and its checkpoint accepted the resume
            accepted = functools.partial(_log_resume, run_dir, done or 0, changes)
    else:
        recipe, overrides = recipe_and_overrides(args)
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
        train(cfg, run_dir, resume=bool(args.resume), on_resume=accepted)
    except KeyboardInterrupt:
        print(
            f"interrupted; resume from the last checkpoint with `pc-megatron train --resume {run_dir}`", file=sys.stderr
        )
        return 130
    return 0


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of a run's latest checkpoint, or None without one."""
    from pc_megatron.checkpoint.store import latest_checkpoint

    folder = latest_checkpoint(run_dir / "checkpoints")
    return int(folder.name.split("_")[-1]) if folder is not None and folder.name.startswith("step_") else None


def _log_resume(run_dir: Path, step: int, changes: dict) -> None:
    """Each accepted change of a resume, with the step it takes effect after, in ``resumes.jsonl``
    (``config.yaml`` is rewritten with the new values when the run starts)."""
    entry = {"after_step": step, "changes": {k: {"was": a, "now": b} for k, (a, b) in changes.items()}}
    with open(run_dir / "resumes.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    print(f"resuming after step {step} with " + ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in changes.items()))
