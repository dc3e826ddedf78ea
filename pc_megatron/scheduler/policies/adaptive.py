"""The adaptive policy (``scheduler.policy=adaptive``): pilots sized and skipped by each prompt's
pass-rate posterior (``belief.py``), full groups without a pilot where the posterior says the group
will be mixed, and at most ``adaptive_budget`` x B x n rollouts an update. It owns its belief and
the inconclusive pilots waiting for their extension (``pending``)."""

from __future__ import annotations

import math
import random

from pc_megatron.scheduler.belief import PassRateBelief
from pc_megatron.scheduler.config import SchedulerConfig
from pc_megatron.scheduler.policies.base import Piloting, call
from pc_megatron.scheduler.pool import PromptPool
from pc_megatron.scheduler.types import Allocation, Entry, GenerateFn, GenRequest, Group, Sample


class Adaptive(Piloting):
    """``pending``: degenerate, inconclusive pilots, extended by the next call while under n_p."""

    def __init__(self, cfg: SchedulerConfig, prompts_per_step: int, samples_per_prompt: int, seed: int) -> None:
        super().__init__(cfg, prompts_per_step, samples_per_prompt, seed)
        self.belief = PassRateBelief(cfg.adaptive_forget)

    def allocate(self, pool: PromptPool, step: int, generate: GenerateFn) -> Allocation:
        """Each round: fresh prompts are judged by their pass-rate posterior: confidently solved
        or hopeless ones are deferred without a pilot (a few are piloted anyway, to explore),
        confidently informative ones get a full n-group at once, the rest a cheap pilot; one
        call carries the full groups, the pilots and the extensions of inconclusive pilots.
        Mixed pilots are buffered and committed up to n in a second call. The step stops at
        ``adaptive_budget`` x B x n generated rollouts: draws are planned to fit it with their
        expected commits, and commits that do not fit wait in the buffer."""
        c, n = self.cfg, self.n
        belief = self.belief
        belief.refit(step)
        groups: list[Group] = []
        rounds = 0
        start = pool.counts["generated"]
        budget = c.adaptive_budget * self.B * n if c.adaptive_budget > 0 else math.inf
        size = min(c.adaptive_pilot, self.n_p)
        while len(groups) < self.B and rounds < c.max_rounds:
            left = budget - (pool.counts["generated"] - start)
            if left < 1:
                break
            rounds += 1
            need = self.B - len(groups)
            taken = {g.prompt for g in groups} | {e.prompt for e in self.pending}
            # extensions of last call's inconclusive pilots go first; those that do not fit wait
            extend: list[Entry] = []
            extend_sizes: list[int] = []  # each up to another pilot's size, not past pilot_samples
            for e in self.pending:
                more = min(size, self.n_p - len(e.samples))
                if sum(extend_sizes) + more > left:
                    break
                extend.append(e)
                extend_sizes.append(more)
            self.pending = self.pending[len(extend) :]
            planned = sum(extend_sizes)
            direct: list[int] = []
            pilots: list[int] = []
            # draw (at most B_gen) until the full groups, the buffer and the pilots' expected yield
            # (each pilot's chance of a mixed group) cover the need, or the planned rollouts (with
            # the expected commits) fill the budget: few draws where the pool is informative
            expected = len(pool.buffer) + 0.5 * len(extend)
            drawn_any = False
            for _ in range(c.gen_prompts_multiplier * need):
                spend = planned + n * len(direct) + size * len(pilots)
                spend += (n - size) * min(max(need - len(direct), 0), expected)  # the expected commits
                if len(direct) + expected >= need or spend + size > left:
                    break
                drawn = pool.fresh(1, taken)
                if not drawn:
                    break
                p, drawn_any = drawn[0], True
                taken.add(p)
                mixed = belief.mixed_prob(p, step, n)
                explore = random.Random(f"{self.seed}/explore/{pool.epoch}/{p}").random() < c.adaptive_explore
                if belief.seen(p) and mixed < c.adaptive_skip_below and not explore:
                    self._skip(pool, p, step)
                elif mixed >= c.adaptive_direct_above and spend + n <= left:
                    direct.append(p)
                else:
                    pilots.append(p)
                    expected += mixed
            short = (-(len(direct) + len(pilots) + len(extend))) % c.request_multiple
            if short and (direct or pilots or extend):  # fill whole engine replicas with extra pilots
                pilots += pool.fresh(short, taken)
            requests = [GenRequest(p, n, "full") for p in direct]
            requests += [GenRequest(p, size, "pilot") for p in pilots]
            requests += [GenRequest(e.prompt, more, "pilot") for e, more in zip(extend, extend_sizes, strict=True)]
            self.pilot_batches += 1
            results = call(pool, generate, requests)
            for p, samples in zip(direct, results, strict=False):
                belief.observe(p, [s.correct for s in samples], step)
                groups.append(Group(p, samples))
                pool.counts["direct_groups"] += 1
            rest = results[len(direct) :]
            for p, samples in zip(pilots, rest, strict=False):
                self._judge(pool, Entry(p, samples, step, self.pilot_batches), samples, step)
            for e, samples in zip(extend, rest[len(pilots) :], strict=True):
                pool.counts["extended"] += 1
                self._judge(pool, Entry(e.prompt, e.samples + samples, e.gen_step, self.pilot_batches), samples, step)
            left = budget - (pool.counts["generated"] - start)
            taken_now = {g.prompt for g in groups}
            chosen = pool.select(step, rounds, self.B - len(groups), taken_now, c.selection, n, left)
            if chosen:
                commits = [GenRequest(e.prompt, n - len(e.samples), "commit") for e in chosen]
                for e, r in zip(chosen, call(pool, generate, commits), strict=True):
                    belief.observe(e.prompt, [s.correct for s in r], step)
                    groups.append(Group(e.prompt, e.samples + r, len(e.samples)))
            pool.enforce_capacity()
            if not requests and not chosen and not drawn_any:
                break  # nothing left to pilot or commit (or nothing that fits): the pool is exhausted
        pool.flush_stale(step)
        return Allocation(groups, rounds)

    def _skip(self, pool: PromptPool, prompt: int, step: int) -> None:
        """A prompt the posterior calls solved or hopeless: not piloted this epoch."""
        self._set_aside(pool, prompt, step, counted=False)
        pool.counts["skipped_confident"] += 1

    def _set_aside(self, pool: PromptPool, prompt: int, step: int, counted: bool) -> None:
        """Evicted when confidently solved (every one of n samples right), else deferred to the next
        epoch (``counted``: in the ``deferred`` counter; a skip is counted as a skip)."""
        if self.belief.all_correct_prob(prompt, step, self.n) >= self.cfg.adaptive_evict_confidence:
            pool.evict(prompt)
        else:
            pool.defer(prompt, counted)

    def _judge(self, pool: PromptPool, entry: Entry, new: list[Sample], step: int) -> None:
        """File an adaptive pilot (``new``: its latest samples): mixed → buffer; degenerate and
        confidently so → deferred (or evicted); degenerate and inconclusive → extended next call
        while under pilot_samples, else buffered when more likely mixed than not."""
        self.belief.observe(entry.prompt, [s.correct for s in new], step)
        correct = sum(s.correct for s in entry.samples)
        if len(new) == len(entry.samples):  # a first pilot (extensions are not counted twice)
            pool.pilot_hist[min(correct, self.n_p)] += 1
        mixed = self.belief.mixed_prob(entry.prompt, step, self.n)
        if 0 < correct < len(entry.samples) or (len(entry.samples) >= self.n_p and mixed >= 0.5):
            pool.buffer_entry(entry)
            return
        if mixed >= self.cfg.adaptive_skip_below and len(entry.samples) < self.n_p:
            self.pending.append(entry)
            return
        self._set_aside(pool, entry.prompt, step, counted=True)
        pool.add("wasted_filtered", entry.samples)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "belief": self.belief.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        self.belief.load_state_dict(sd["belief"])
