"""``pc-megatron config show [RECIPE] [key=value ...]``: the resolved config as YAML."""

from __future__ import annotations

import argparse

from pc_megatron.commands import add_recipe_arguments, recipe_and_overrides


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="config tools")
    tools = p.add_subparsers(dest="config_command", required=True)
    show = tools.add_parser("show", help="print the resolved config")
    add_recipe_arguments(show)
    show.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config, to_yaml

    print(to_yaml(load_config(*recipe_and_overrides(args))), end="")
    return 0
