"""``pc-megatron score FILE``: score a JSONL of id/completion/answer rows with a reward, offline (the
reward pool of training, with its workers and per-completion deadline)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score a JSONL of id/completion/answer rows with a reward, offline")
    p.add_argument("file", help="JSONL rows with id, completion, answer")
    p.add_argument("--reward", default="math_verify", help="registered reward name (default: math_verify)")
    p.add_argument("--function", help="or a reward function as module:function")
    p.add_argument("--out", metavar="OUT", help="write the rows with score and correct here (JSONL)")
    p.add_argument("--workers", type=int, default=2, help="reward worker processes")
    p.add_argument("--timeout-s", type=float, default=10.0, help="per-completion deadline")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pc_megatron.rewards.config import RewardConfig
    from pc_megatron.rewards.offline import score_file

    cfg = RewardConfig(
        name=args.reward, function=args.function or "", workers=args.workers, timeout_s=args.timeout_s, on_error="count"
    )
    out = Path(args.out) if args.out else None
    summary = score_file(Path(args.file), cfg, out)
    print(json.dumps({"file": args.file, **({"out": args.out} if out else {}), **summary}))
    return 0
