"""DAPO's dynamic sampling (``scheduler.policy=dapo``): rounds of B_gen fresh prompts x n samples;
groups whose rewards are all equal are dropped, mixed groups kept until there are B, and the
surplus of the last round discarded (every generated rollout is counted)."""

from __future__ import annotations

from pc_megatron.scheduler.policies.base import Policy, call, rounded
from pc_megatron.scheduler.pool import PromptPool
from pc_megatron.scheduler.types import Allocation, GenerateFn, GenRequest, Group


class Dapo(Policy):
    def allocate(self, pool: PromptPool, step: int, generate: GenerateFn) -> Allocation:
        c = self.cfg
        kept: list[Group] = []
        rounds = 0
        while len(kept) < self.B and rounds < c.max_rounds:
            rounds += 1
            k = rounded(c.gen_prompts_multiplier * self.B, c.request_multiple)
            prompts = pool.fresh(k, {g.prompt for g in kept})
            if not prompts:
                break
            results = call(pool, generate, [GenRequest(p, self.n, "full") for p in prompts])
            for p, samples in zip(prompts, results, strict=True):
                if len({s.reward for s in samples}) == 1:
                    pool.add("wasted_degenerate", samples)
                elif len(kept) < self.B:
                    kept.append(Group(p, samples))
                else:
                    pool.add("wasted_surplus", samples)
        return Allocation(kept, rounds)
