"""``pc-megatron train [RECIPE] [key=value ...]`` and ``--resume RUN_DIR``: the RL run (its loop is
``pc_megatron/train.py``); a resume continues from the latest checkpoint with the keys a resume may
change (``run/folder.py``'s ``RESUME_SAFE``), each change logged in ``resumes.jsonl``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pc_megatron.commands import add_recipe_arguments, recipe_and_overrides


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="warm-start (cached) then RL on a recipe")
    add_recipe_arguments(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config
    from pc_megatron.errors import ConfigError
    from pc_megatron.run.folder import RunFolder
    from pc_megatron.train import train

    if args.resume:
        if args.recipe and "=" not in args.recipe:
            raise ConfigError("--resume takes the recipe from RUN_DIR/config.yaml; pass only key=value overrides")
        overrides = ([args.recipe] if args.recipe else []) + args.overrides
        folder, cfg = RunFolder.resumed(Path(args.resume), overrides)
        if folder.complete(cfg.steps):
            print(
                f"{folder.path}: the run is complete (step {folder.done} of {cfg.steps}); nothing to do (raise steps= "
                "to train on)"
            )
            return 0
    else:
        recipe, overrides = recipe_and_overrides(args)
        cfg = load_config(recipe, overrides)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            "pc-megatron train is not launched by torchrun: run it once, with runtime=ray, and Ray places "
            "the learner ranks (learner.tensor_parallel_size / pipeline_parallel_size / data_parallel_size)"
        )
    if not args.resume:
        folder = RunFolder.new(recipe, cfg)
    print(f"run directory: {folder.path}", flush=True)
    try:
        train(cfg, folder)
    except KeyboardInterrupt:
        print(
            f"interrupted; resume from the last checkpoint with `pc-megatron train --resume {folder.path}`",
            file=sys.stderr,
        )
        return 130
    return 0
