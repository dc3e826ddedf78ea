"""The adaptive policy (``pc_megatron/scheduler/policies/adaptive.py``) on fixed pass rates: little spent
where groups degenerate, nothing extra where they do not, at most GRPO's rollouts per update, and
nearly-saturated prompts skipped once the posterior knows them."""

import random

from pc_megatron.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.oracle import Oracle


def _rollouts_per_mixed_group(policy: str, probs: list[float], steps: int = 30) -> tuple[float, float]:
    """(rollouts generated per trained group with both right and wrong samples, pilot share)."""
    cfg = SchedulerConfig(policy=policy, bind=False)
    sched, oracle = Scheduler(cfg, 400, 8, 32, 0), Oracle(400, 1)
    oracle.p = [random.Random(i).choice(probs) for i in range(400)]
    mixed = 0
    for step in range(steps):
        oracle.version = step
        batch = sched.next_batch(step, oracle, policy_version=step)
        mixed += sum(0 < sum(s.correct for s in g.samples) < len(g.samples) for g in batch.groups)
    return sched.pool.counts["generated"] / max(mixed, 1), sched.pool.counts["generated_pilot"] / sched.pool.counts[
        "generated"
    ]


def test_adaptive_spends_little_where_groups_degenerate_and_nothing_extra_where_they_do_not():
    """With fixed pass rates (the oracle): in a pool of 70% solved or hopeless prompts, adaptive
    needs far fewer rollouts per informative trained group than GRPO and fewer than the paper's
    Pilot-Commit; in a pool where every group is informative it allocates exactly as GRPO."""
    graded = [0.0] * 45 + [1.0] * 25 + [0.1, 0.3, 0.5, 0.7, 0.9] * 6
    grpo, _ = _rollouts_per_mixed_group("grpo", graded)
    paper, _ = _rollouts_per_mixed_group("pilot_commit", graded)
    adaptive, _ = _rollouts_per_mixed_group("adaptive", graded)
    assert adaptive * 2 < grpo and adaptive * 1.2 < paper, (grpo, paper, adaptive)
    informative = [0.3, 0.5, 0.7]
    grpo, _ = _rollouts_per_mixed_group("grpo", informative)
    adaptive, pilot_share = _rollouts_per_mixed_group("adaptive", informative)
    assert adaptive == grpo and pilot_share == 0.0


def test_adaptive_spends_at_most_grpos_rollouts_per_update_and_trains_more_informative_groups():
    """The budget: adaptive never generates more than GRPO's B x n rollouts in a step, and for them
    trains more groups with both right and wrong samples than GRPO does (on a pool of 70% solved or
    hopeless prompts); without the cap (``adaptive_budget=0``) it fills B groups and spends more."""
    graded = [0.0] * 45 + [1.0] * 25 + [0.1, 0.3, 0.5, 0.7, 0.9] * 6
    B, n, steps = 8, 32, 30

    def run(policy: str, budget: float) -> tuple[list[int], int, int]:
        sched = Scheduler(SchedulerConfig(policy=policy, bind=False, adaptive_budget=budget), 400, B, n, 0)
        oracle = Oracle(400, 1)
        oracle.p = [random.Random(i).choice(graded) for i in range(400)]
        spent, groups, mixed = [], 0, 0
        for step in range(steps):
            oracle.version = step
            batch = sched.next_batch(step, oracle, policy_version=step)
            spent.append(batch.stats["step_generated"])
            groups += len(batch.groups)
            mixed += sum(0 < sum(s.correct for s in g.samples) < len(g.samples) for g in batch.groups)
        return spent, groups, mixed

    grpo_spent, _, grpo_mixed = run("grpo", 1.0)
    spent, groups, mixed = run("adaptive", 1.0)
    assert max(spent) <= B * n and sum(spent) > 0.8 * sum(grpo_spent), spent
    assert mixed > 1.5 * grpo_mixed and groups <= B * steps, (mixed, grpo_mixed, groups, spent)
    uncapped, groups, _ = run("adaptive", 0.0)
    assert max(uncapped) > B * n and groups > 0.95 * B * steps, uncapped


def test_adaptive_skips_prompts_it_knows_are_saturated_when_they_are_nearly_so():
    """Real "hopeless" prompts are rarely exactly p = 0 (nor solved ones exactly 1): with pass
    rates within 0.5% of 0 or 1, the posterior learns over epochs of a small pool that such a
    prompt's 32-group will be all alike, and skips it; a prompt at p = 1% is not skipped, since its
    32-group is mixed 27% of the time, above ``adaptive_skip_below`` (the graded pool's
    "hopeless" prompts, p < 0.02, are mostly of that kind: docs/LOG.md, 2026-12-04)."""

    def skipped(hopeless: list[float], solved: list[float]) -> int:
        rates = hopeless * 15 + solved * 8 + [0.1, 0.3, 0.5, 0.7, 0.9] * 6
        sched, oracle = Scheduler(SchedulerConfig(policy="adaptive", bind=False), 200, 8, 32, 0), Oracle(200, 1)
        oracle.p = [random.Random(i).choice(rates) for i in range(200)]
        for step in range(60):
            oracle.version = step
            sched.next_batch(step, oracle, policy_version=step)
        assert sched.pool.epoch >= 3
        return sched.pool.counts["skipped_confident"]

    assert skipped([0.0, 0.002, 0.005], [1.0, 0.998, 0.995]) > 100
    assert skipped([0.01] * 3, [0.99] * 3) == 0
