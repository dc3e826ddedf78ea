"""The ``pc-megatron`` commands, one module each: ``add_parser(sub)`` declares its arguments and sets
``run(args) -> exit code``. Each module keeps its heavy imports (torch, Megatron, vLLM) inside its
functions, so ``pc-megatron --help`` and a command's parse stay fast."""

from __future__ import annotations

import argparse

DEFAULT_RECIPE = "tiny"


def add_recipe_arguments(p: argparse.ArgumentParser) -> None:
    """``RECIPE [key=value ...]``: a recipe in configs/ or a YAML path (default tiny), then overrides."""
    p.add_argument("recipe", nargs="?", help=f"recipe name in configs/ or a YAML path (default: {DEFAULT_RECIPE})")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. learner.lr=1e-4")


def recipe_and_overrides(args: argparse.Namespace) -> tuple[str, list[str]]:
    recipe, overrides = args.recipe or DEFAULT_RECIPE, list(args.overrides)
    if "=" in recipe:  # `pc-megatron CMD key=value ...` with the default recipe
        recipe, overrides = DEFAULT_RECIPE, [recipe, *overrides]
    return recipe, overrides
