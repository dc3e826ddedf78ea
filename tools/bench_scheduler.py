"""Time the scheduler's own decisions on a large pool, without any generation cost.

    python tools/bench_scheduler.py --prompts 1000000 --policy pilot_commit --steps 20

The oracle answers instantly (a Bernoulli per sample), so the timed part is the scheduler:
drawing fresh prompts, filing pilots, selecting, flushing, accounting. Reports the median and
max seconds per ``next_batch`` and the time of the first call (which builds the epoch order).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pc_megatron.scheduler import POLICIES, Sample, Scheduler, SchedulerConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=1_000_000)
    ap.add_argument("--policy", default="pilot_commit", choices=list(POLICIES))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    rng = random.Random(0)
    oracle_time = 0.0

    def generate(requests):
        nonlocal oracle_time
        t0 = time.perf_counter()
        out = [[Sample(c, float(c)) for c in (rng.random() < 0.4 for _ in range(r.n))] for r in requests]
        oracle_time += time.perf_counter() - t0
        return out

    t0 = time.perf_counter()
    sched = Scheduler(SchedulerConfig(policy=args.policy), args.prompts, args.batch, args.samples, seed=0)
    build = time.perf_counter() - t0
    times = []
    for step in range(args.steps):
        oracle_time = 0.0
        t0 = time.perf_counter()
        sched.next_batch(step, generate, policy_version=step)
        times.append(time.perf_counter() - t0 - oracle_time)
    rest = sorted(times[1:]) or times
    print(
        f"pool {args.prompts:,} policy {args.policy} B={args.batch} n={args.samples}: construct {build:.3f} s, "
        f"first decision {times[0]:.3f} s, median {rest[len(rest) // 2] * 1e3:.2f} ms, max {max(rest) * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
