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
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pc_megatron.scheduler import Sample, Scheduler
from pc_megatron.scheduler.core import SchedulerConfig


class FixedPassRates:
    """``generate`` for the scheduler: sample i of a request is correct with the prompt's rate."""

    def __init__(self, rates: list[float], seed: int) -> None:
        self.rates, self.rng = rates, random.Random(seed)

    def __call__(self, requests):
        return [[Sample(self.rng.random() < self.rates[r.prompt], 0.0, tokens=1) for _ in range(r.n)] for r in requests]


def simulate(rates: list[float], cfg: SchedulerConfig, steps: int, B: int, n: int, seed: int) -> dict:
    sched, gen = Scheduler(cfg, len(rates), B, n, seed), FixedPassRates(rates, seed)
    groups = mixed = 0
    for step in range(steps):
        for batch in [sched.next_batch(step, gen, policy_version=step)]:
            groups += len(batch.groups)
            mixed += sum(0 < sum(s.correct for s in g.samples) < len(g.samples) for g in batch.groups)
    c = sched.counts
    return {
        "per_informative_group": c["generated"] / max(mixed, 1),
        "degenerate_trained": 1 - mixed / max(groups, 1),
        "epochs": sched.epoch,
        "generated": c["generated"],
        "skipped_confident": c["skipped_confident"],
        "direct_groups": c["direct_groups"],
        "evicted": c["evicted"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pool", type=Path)
    ap.add_argument("overrides", nargs="*", help="scheduler fields, e.g. adaptive_pilot=8")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--policies", nargs="+", default=["grpo", "pilot_commit", "adaptive"])
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
