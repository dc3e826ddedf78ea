"""Scoring throughput of the reward pool on realistic math completions (completions per second).

    python tools/bench_reward.py [--n 1000] [--workers 1 2] [--hang-frac 0.01] [--timeout-s 2]

Builds ``--n`` chain-of-thought completions (a few hundred words of working, then a boxed final
answer in one of the spellings of tests/rewards/test_math.py, right or wrong against the reference),
and scores them with ``reward.name=math_verify`` through ``pc-megatron score``'s code path: once
clean, and once with ``--hang-frac`` of them ending in an expression that hangs the parser (each
costs ``--timeout-s`` of one worker). Every configuration is run in one process, side by side.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: its tests package

from pc_megatron.rewards.config import RewardConfig
from pc_megatron.rewards.offline import score_file
from tests.rewards.test_math import PAIRS

WORDS = "let the sum be so we get then divide both sides by hence substitute into the equation and simplify".split()


def completions(n: int, hang_frac: float, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        pred, gold, _ = PAIRS[rng.randrange(len(PAIRS))]
        steps = []
        for _ in range(rng.randint(4, 12)):
            a, b = rng.randint(2, 999), rng.randint(2, 99)
            steps.append(f"{' '.join(rng.choices(WORDS, k=rng.randint(8, 30)))} ${a} \\times {b} = {a * b}$.")
        if rng.random() < hang_frac:
            pred = "9^{9^{9^{9}}}"
        rows.append(
            {
                "id": i,
                "completion": "\n".join(steps) + f"\nTherefore the answer is $\\boxed{{{pred}}}$.",
                "answer": gold,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--hang-frac", type=float, default=0.01)
    ap.add_argument("--timeout-s", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for label, frac in (("clean", 0.0), (f"{args.hang_frac:.0%} hanging", args.hang_frac)):
            path = Path(tmp) / f"{frac}.jsonl"
            rows = completions(args.n, frac)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            chars = sum(len(r["completion"]) for r in rows) / len(rows)
            for w in args.workers:
                cfg = RewardConfig(name="math_verify", workers=w, timeout_s=args.timeout_s, on_error="count")
                res = score_file(path, cfg, None, progress=False)
                print(json.dumps({"set": label, "workers": w, "mean_chars": round(chars), **res}), flush=True)


if __name__ == "__main__":
    main()
