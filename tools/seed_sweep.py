"""Run the default recipe at several seeds and report the held-out gain and its spread.

    python tools/seed_sweep.py --seeds 0 1 2 [key=value ...]

Seeds vary the RL run (sampling, prompt order); the warm-start is shared (it is cached by its
own config), so the spread is RL's seed-to-seed noise. Prints a Markdown table for docs/LOG.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--out", default="runs/seed_sweep")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows = []
    for seed in args.seeds:
        name = f"{stamp}-seed{seed}"
        cmd = [
            sys.executable,
            "-m",
            "pc_megatron.cli",
            "train",
            args.recipe,
            f"seed={seed}",
            f"out_dir={args.out}",
            f"name={name}",
            "progress=false",
            *args.overrides,
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        s = json.loads((Path(args.out) / name / "summary.json").read_text())
        rows.append((seed, s))
    gains = [s["final_eval_accuracy"] - s["initial_eval_accuracy"] for _, s in rows]
    print("| seed | initial | final | best | gain | cum rollouts | wall s |")
    print("|---|---|---|---|---|---|---|")
    for (seed, s), g in zip(rows, gains, strict=True):
        print(
            f"| {seed} | {s['initial_eval_accuracy']:.3f} | {s['final_eval_accuracy']:.3f} | "
            f"{s['best_eval_accuracy']:.3f} | {g:+.3f} | {s['cum_rollouts']} | {s['wall_s']:.0f} |"
        )
    sd = statistics.stdev(gains) if len(gains) > 1 else float("nan")
    print(f"\nmean gain {statistics.mean(gains):+.3f}, seed-to-seed std of the final accuracy {sd:.3f}")


if __name__ == "__main__":
    main()
