"""``pc-megatron convert --to hf|megatron SRC OUT``: HF folders <-> Megatron TP/PP shards, and any
training checkpoint or run directory -> an HF folder (``pc_megatron/checkpoint/convert.py``)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="HF <-> Megatron tensor-parallel shards (see pc_megatron/checkpoint/convert.py)")
    p.add_argument("--to", required=True, choices=["hf", "megatron"])
    p.add_argument("src", help="HF folder (--to megatron); shard folder, checkpoint or run directory (--to hf)")
    p.add_argument("out", help="output folder (must not exist; written atomically)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the shards (--to megatron)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size of the shards (--to megatron)")
    p.add_argument("--max-shard-gb", type=float, default=2.0, help="largest output safetensors file (--to hf)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pc_megatron.checkpoint.convert import hf_to_megatron, megatron_to_hf_folder

    if args.to == "megatron":
        res = hf_to_megatron(args.src, args.out, tp=args.tp, pp=args.pp)
    else:
        res = megatron_to_hf_folder(args.src, args.out, max_shard_gb=args.max_shard_gb)
    gb = res["bytes"] / 1e9
    print(f"{args.out}: {gb:.2f} GB in {res['seconds']:.1f} s ({gb / max(res['seconds'], 1e-9):.2f} GB/s)")
    return 0
