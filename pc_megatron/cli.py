"""``pc-megatron``: train, warmstart, compare, profile, report, survey, score, plan, convert, config show.

Each command is a module of ``pc_megatron/commands`` with its own arguments and run function; this
module only builds the parser from them and turns the errors a user can fix into one line."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from pc_megatron.commands import compare, config, convert, plan, profile, report, score, survey, train, warmstart

COMMANDS = (train, warmstart, compare, profile, plan, survey, score, report, convert, config)


def _quiet() -> None:
    # Megatron-Core warns at import that TE/Apex are absent; on CPU that is expected.
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
    warnings.filterwarnings("ignore", message=".*Apex is not installed.*")
    warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pc-megatron", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    _quiet()
    args = parser().parse_args(argv)

    from pc_megatron.errors import UserError
    from pc_megatron.run.preemption import RunStopped

    try:
        return args.run(args)
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
