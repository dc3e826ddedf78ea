"""The scheduler the training loop drives: the prompt pool (``pool.py``) and the configured policy
(``policies/``), composed. One ``next_batch`` call is one step's allocation, with the step's
statistics; ``state_dict`` is the whole of both, in the checkpoint format of ``STATE_KEYS``."""

from __future__ import annotations

from pc_megatron.scheduler.belief import PassRateBelief
from pc_megatron.scheduler.config import SchedulerConfig
from pc_megatron.scheduler.policies import POLICIES, Policy
from pc_megatron.scheduler.pool import PromptPool
from pc_megatron.scheduler.types import Allocation, Entry, GenerateFn

STATE_KEYS = ("epoch", "cursor", "state", "counts", "tokens", "pilot_batches", "buffer", "pending", "belief")
"""The checkpoint dict's keys, as they were when one class held the pool and every policy (so a
checkpoint written then loads now): the pool's ``epoch``, ``cursor``, ``state``, ``counts``,
``tokens`` and ``buffer`` (entries as ``(prompt, samples, gen_step, seq)``); the piloting policies'
``pilot_batches`` and ``pending`` (entries alike); the adaptive policy's ``belief``. Every policy's
checkpoint has every key: a policy writes what it does not hold empty (0, [], a belief with no
evidence)."""


class Scheduler:
    """Which prompts get how many samples each step, under ``cfg.policy``."""

    def __init__(
        self, cfg: SchedulerConfig, num_prompts: int, prompts_per_step: int, samples_per_prompt: int, seed: int
    ):
        cfg.validate()
        self.cfg, self.N, self.B, self.n, self.seed = cfg, num_prompts, prompts_per_step, samples_per_prompt, seed
        self.n_p = cfg.pilot_size(samples_per_prompt)  # the size of the pilot histogram, whatever the policy
        self.pool = PromptPool(num_prompts, seed, cfg.buffer_capacity or 4 * prompts_per_step, cfg.max_off_steps)
        self.policy: Policy = POLICIES[cfg.policy](cfg, prompts_per_step, samples_per_prompt, seed)

    def _waiting(self) -> list[Entry]:
        """Generated pilots not yet trained nor wasted: the pool's buffer, then the policy's pending."""
        return [*self.pool.buffer.values(), *self.policy.pending]

    def next_batch(self, step: int, generate: GenerateFn, policy_version: int = 0) -> Allocation:
        pool = self.pool
        before, tokens_before = dict(pool.counts), dict(pool.tokens)
        pool.pilot_hist = [0] * (self.n_p + 1)
        allocation = self.policy.allocate(pool, step, generate)
        for g in allocation.groups:
            pool.add("trained", g.samples)
        lags = [policy_version - s.policy_version for g in allocation.groups for s in g.samples]
        waiting = self._waiting()
        ages = [step - e.gen_step for e in waiting]  # steps since generated
        allocation.stats = {
            **{f"step_{k}": pool.counts[k] - before[k] for k in pool.counts},
            **{f"cum_{k}": v for k, v in pool.counts.items()},
            **{f"step_tokens_{k}": pool.tokens[k] - tokens_before[k] for k in pool.tokens},
            **{f"cum_tokens_{k}": v for k, v in pool.tokens.items()},
            "groups": len(allocation.groups),
            "rounds": allocation.rounds,
            "buffer_size": len(waiting),  # with the policy's pending pilots (bound ones are filed next step)
            "buffer_age_mean": sum(ages) / len(ages) if ages else 0.0,
            "buffer_age_max": max(ages, default=0),
            # eviction is permanent and happens once per prompt, so the cumulative count is the pool's
            "pool_active": self.N - pool.counts["evicted"],
            "pool_evicted": pool.counts["evicted"],
            "pool_deferred": pool.n_deferred,  # back at the next epoch
            "pilot_hist": list(pool.pilot_hist),
            "epoch": pool.epoch,
            "max_policy_lag": max(lags, default=0),
            "mean_policy_lag": sum(lags) / len(lags) if lags else 0.0,
        }
        return allocation

    def buffered_samples(self) -> int:
        return sum(len(e.samples) for e in self._waiting())

    def state_dict(self) -> dict:
        empty = {"pilot_batches": 0, "pending": [], "belief": PassRateBelief(self.cfg.adaptive_forget).state_dict()}
        sd = {**self.pool.state_dict(), **empty, **self.policy.state_dict()}
        return {k: sd[k] for k in STATE_KEYS}

    def load_state_dict(self, sd: dict) -> None:
        self.pool.load_state_dict(sd)
        self.policy.load_state_dict(sd)
