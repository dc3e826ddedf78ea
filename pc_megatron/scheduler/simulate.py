"""Allocation alone: a policy on a pool whose pass rates are fixed, with no model and no learning
(``tools/sim_allocation.py``, ``pc-megatron survey``). It shows where each allocator's rollouts go
while the policy stands still; training runs are the real test."""

from __future__ import annotations

import random

from pc_megatron.scheduler.config import SchedulerConfig
from pc_megatron.scheduler.core import Scheduler
from pc_megatron.scheduler.types import Sample


class FixedPassRates:
    """``generate`` for the scheduler: sample i of a request is correct with the prompt's rate."""

    def __init__(self, rates: list[float], seed: int) -> None:
        self.rates, self.rng = rates, random.Random(seed)

    def __call__(self, requests):
        return [[self._sample(r.prompt) for _ in range(r.n)] for r in requests]

    def _sample(self, prompt: int) -> Sample:
        ok = self.rng.random() < self.rates[prompt]
        return Sample(ok, float(ok), tokens=1)  # the reward varies with correctness (DAPO filters on it)


def simulate(rates: list[float], cfg: SchedulerConfig, steps: int, B: int, n: int, seed: int) -> dict:
    """``steps`` of ``cfg``'s policy on a pool of ``rates``: rollouts generated per trained group with
    both right and wrong samples, rollouts generated per update (step), the share of trained groups
    that were all alike, the epoch reached and the adaptive allocator's decision counters."""
    sched, gen = Scheduler(cfg, len(rates), B, n, seed), FixedPassRates(rates, seed)
    groups = mixed = 0
    for step in range(steps):
        batch = sched.next_batch(step, gen, policy_version=step)
        groups += len(batch.groups)
        mixed += sum(0 < sum(s.correct for s in g.samples) < len(g.samples) for g in batch.groups)
    c = sched.pool.counts
    return {
        "per_informative_group": c["generated"] / max(mixed, 1),
        "per_update": c["generated"] / max(steps, 1),
        "degenerate_trained": 1 - mixed / max(groups, 1),
        "epochs": sched.pool.epoch,
        "generated": c["generated"],
        "skipped_confident": c["skipped_confident"],
        "direct_groups": c["direct_groups"],
        "evicted": c["evicted"],
    }
