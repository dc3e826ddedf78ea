"""Allocation alone, in seconds: every policy on a prompt pool whose pass rates are fixed at their
exact values under the warm-start (the ``initial_pass_rate`` the graded and easy pools store), with
no model and no learning. It shows where each allocator's rollouts go when the policy does not
move; training runs (`pc-megatron compare`) are the real test.

    python tools/sim_allocation.py POOL.jsonl [--steps 80] [--B 16] [--n 32] [--seeds 0 1 2]
        [--policies grpo pilot_commit adaptive] [key=value scheduler overrides ...]

POOL.jsonl: a pool the project cached (``$PC_MEGATRON_CACHE/pools/<key>/train.jsonl``) or any rows
with ``initial_pass_rate``. Per policy, means over seeds: rollouts generated per trained group
with both right and wrong samples, the share of trained groups that were all alike, the epoch
the run reached (0 = the first), and the counters of the adaptive allocator's decisions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pc_megatron.scheduler import POLICIES, SchedulerConfig
from pc_megatron.scheduler.simulate import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pool", type=Path)
    ap.add_argument("overrides", nargs="*", help="scheduler fields, e.g. adaptive_pilot=8")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--policies", nargs="+", default=["grpo", "pilot_commit", "adaptive"], choices=list(POLICIES))
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.pool.read_text().splitlines() if line.strip()]
    rates = [r["initial_pass_rate"] for r in rows]
    extra = {}
    for o in args.overrides:
        key, value = o.split("=", 1)
        kind = type(getattr(SchedulerConfig(), key))
        extra[key] = kind(value) if kind is not bool else value.lower() == "true"
    print(f"{len(rates)} prompts, B={args.B}, n={args.n}, {args.steps} steps, seeds {args.seeds} {extra or ''}")
    print("| policy | rollouts per informative group | degenerate trained groups | epoch reached | skipped | direct |")
    print("|---|---|---|---|---|---|")
    for policy in args.policies:
        cfg = dataclasses.replace(SchedulerConfig(policy=policy), **extra)
        runs = [simulate(rates, cfg, args.steps, args.B, args.n, s) for s in args.seeds]
        m = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {policy} | {m['per_informative_group']:.1f} | {m['degenerate_trained']:.2f} "
            f"| {m['epochs']:.1f} | {m['skipped_confident']:.0f} | {m['direct_groups']:.0f} |"
        )


if __name__ == "__main__":
    main()
