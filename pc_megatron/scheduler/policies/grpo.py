"""GRPO's allocation (``scheduler.policy=grpo``): one round of B fresh prompts x n samples; every
group is trained, whatever its rewards."""

from __future__ import annotations

from pc_megatron.scheduler.policies.base import Policy, call
from pc_megatron.scheduler.pool import PromptPool
from pc_megatron.scheduler.types import Allocation, GenerateFn, GenRequest, Group


class Grpo(Policy):
    def allocate(self, pool: PromptPool, step: int, generate: GenerateFn) -> Allocation:
        prompts = pool.fresh(self.B)
        results = call(pool, generate, [GenRequest(p, self.n, "full") for p in prompts])
        return Allocation([Group(p, s) for p, s in zip(prompts, results, strict=True)], rounds=1)
