"""``pc-megatron warmstart [RECIPE]``: run (or find in the cache) a recipe's SFT warm-start and print
its folder; ``--ship`` copies it into the package's shipped warm-starts."""

from __future__ import annotations

import argparse

from pc_megatron.commands import add_recipe_arguments, recipe_and_overrides


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("warmstart", help="run (or find) the SFT warm-start of a recipe and print its folder")
    add_recipe_arguments(p)
    p.add_argument("--ship", action="store_true", help="copy it into the package's shipped warm-starts")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import shutil

    import torch

    from pc_megatron.config import load_config
    from pc_megatron.errors import ConfigError
    from pc_megatron.run.prepare import prepare_run
    from pc_megatron.warmstart import SHIPPED

    cfg = load_config(*recipe_and_overrides(args))
    from pc_megatron.runtime.resources import plan_threads

    torch.set_num_threads(plan_threads(cfg).learner)
    if not cfg.warmstart.enabled:
        raise ConfigError("this recipe has warmstart.enabled=false: there is no warm-start to run")
    path = prepare_run(cfg, progress=cfg.progress).policy_dir
    if args.ship and path.parent != SHIPPED:
        dest = SHIPPED / path.name
        shutil.copytree(path, dest, dirs_exist_ok=True)
        path = dest
    print(path)
    return 0
