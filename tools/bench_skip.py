"""The zero-advantage skip (``algo.skip_zero_advantage``), side by side: one RL update of B groups of
n rollouts, a share of them all alike, with the skip off and on in turn, round after round in one
process (a drift of the machine hits both alike). Prints the learner's train seconds per update (the
``train`` phase: forward and backward; the optimizer step apart) and the ratio, paired by round.

    python tools/bench_skip.py [--shape smollm2] [--groups 8 --samples 8] [--degenerate 0.5]
        [--prompt-len 64] [--mu 3.3 --sigma 0.4] [--rounds 3] [--threads 2] [--out skip.json]

The defaults are smollm2-arith's step: 8 prompts of ~64 tokens after the chat template, 8 answers
each of ~27 tokens, half the groups all alike (the survey's n = 8 forecast). Random weights of the
shape: the time of a pass does not depend on their values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch


def groups_of(args, vocab: int):
    from pc_megatron.rollout.base import Completion
    from pc_megatron.scheduler import Group, Sample

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.groups)]
    alike = round(args.degenerate * args.groups)
    out = []
    for i in range(args.groups):
        samples = []
        for j in range(args.samples):
            n = int(torch.exp(torch.randn(1, generator=g) * args.sigma + args.mu).round().clamp(4, 96))
            ids = torch.randint(1, vocab, (n,), generator=g).tolist()
            correct = (i % 2 == 0) if i < alike else (j % 2 == 0)  # the first `alike` groups all alike
            comp = Completion(prompt_index=i, token_ids=ids, logprobs=[-1.0] * n, finish_reason="stop")
            samples.append(Sample(correct=correct, reward=float(correct), payload=comp, tokens=n))
        out.append(Group(prompt=i, samples=samples))
    return out, prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2", help="one of tools/bench_learner.py's SHAPES")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--degenerate", type=float, default=0.5)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--mu", type=float, default=3.3)
    ap.add_argument("--sigma", type=float, default=0.4)
    ap.add_argument("--budget", type=int, default=2048, help="learner.max_tokens_per_micro_batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()

    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench_learner import SHAPES, random_model

    from pc_megatron.algo.config import AlgoConfig
    from pc_megatron.algo.update import rl_update
    from pc_megatron.learner.config import LearnerConfig
    from pc_megatron.learner.learner import Learner
    from pc_megatron.phases import PhaseTimes

    torch.set_num_threads(args.threads)
    groups, prompts = groups_of(args, SHAPES[args.shape]["vocab_size"])
    tok = SimpleNamespace(pad_token_id=0)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_model(Path(tmp) / args.shape, args.shape, torch.float32)
        learner = Learner(folder, LearnerConfig(lr=1e-7, max_tokens_per_micro_batch=args.budget), seed=0)
        warm_up = AlgoConfig(skip_zero_advantage=False)
        rl_update(learner, None, groups, prompts, tok, warm_up, 1.0, PhaseTimes())
        for r in range(args.rounds):
            for skip in (False, True):
                times = PhaseTimes()
                t0 = time.perf_counter()
                algo = AlgoConfig(skip_zero_advantage=skip)
                out = rl_update(learner, None, groups, prompts, tok, algo, 1.0, times)
                rows.append(
                    {
                        "round": r,
                        "skip": skip,
                        "train_s": times.seconds["train"],
                        "update_s": time.perf_counter() - t0,
                        "micro_batches": out["learner/micro_batches"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    ratios = [
        a["train_s"] / b["train_s"] for a, b in zip(rows[0::2], rows[1::2], strict=True)
    ]  # off / on, paired by round
    summary = {
        "args": vars(args),
        "train_s_off": statistics.mean(r["train_s"] for r in rows if not r["skip"]),
        "train_s_on": statistics.mean(r["train_s"] for r in rows if r["skip"]),
        "ratio_per_round": ratios,
    }
    print(
        f"train phase per update: skip off {summary['train_s_off']:.2f} s, on {summary['train_s_on']:.2f} s; "
        f"off / on by round {', '.join(f'{x:.2f}' for x in ratios)}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, **summary}, indent=2))


if __name__ == "__main__":
    main()
