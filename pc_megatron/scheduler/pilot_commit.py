"""The paper's Pilot-Commit policy (``scheduler.policy=pilot_commit``): pilot B_gen fresh prompts
with n_p samples, file each by its pilot pass rate (buffer, evict, defer or skip), commit n_c more
samples to up to B buffered prompts; with ``bind``, commit(t) and the pilot of t+1 share one call.
A mixin of :class:`pc_megatron.scheduler.core.Scheduler`, whose pool, buffer and accounting it uses."""

from __future__ import annotations

import functools
import math

from pc_megatron.scheduler.types import Allocation, Entry, GenerateFn, GenRequest, Group, Sample


@functools.lru_cache(maxsize=4096)
def pass_rate_lower_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower bound on p after ``k`` of ``n`` correct: the smallest p
    with P(X >= k | p) >= 1 - confidence (bisection on the binomial tail)."""
    if k == 0:
        return 0.0

    def tail(p: float) -> float:
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if tail(mid) >= 1 - confidence else (mid, hi)
    return hi


class PilotCommit:
    def _file_pilot(self, entry: Entry) -> None:
        """Sort one pilot result into buffer / evicted / deferred / skipped."""
        c, correct = self.cfg, sum(s.correct for s in entry.samples)
        p_hat = correct / len(entry.samples)
        self.pilot_hist[correct] += 1
        if p_hat >= c.p_evict and pass_rate_lower_bound(correct, len(entry.samples)) >= self.evict_guard:
            self._evict(entry.prompt)
        elif p_hat > c.p_upper:
            self.counts["skipped_easy"] += 1
        elif p_hat < c.p_lower:
            self._defer(entry.prompt)
        else:
            self._buffer(entry)
            return
        self._add("wasted_filtered", entry.samples)

    def _pilot_requests(self, commits: int = 0) -> list[GenRequest]:
        """B_gen fresh pilots (rounded so that ``commits`` + pilots fill whole engine replicas)."""
        k = self._rounded(self.cfg.gen_prompts_multiplier * self.B, commits)
        self.pilot_batches += 1
        return [GenRequest(p, self.n_p, "pilot") for p in self._fresh(k)]

    def _entries(self, requests: list[GenRequest], results: list[list[Sample]], step: int) -> list[Entry]:
        return [Entry(q.prompt, r, step, self.pilot_batches) for q, r in zip(requests, results, strict=True)]

    def _run_pilots(self, generate: GenerateFn, requests: list[GenRequest], gen_step: int) -> list[Entry]:
        return self._entries(requests, self._call(generate, requests), gen_step)

    def _pilot_commit(self, step: int, generate: GenerateFn) -> Allocation:
        """Each round: file pilots → select up to the missing count → commit → trim.

        Unbound, a round's pilot is generated in the round itself. Bound, it was generated in
        the previous generate call (the last call of step t-1 carries step t's first pilot),
        so each call holds the commits of one round and the pilot of the next.
        """
        groups: list[Group] = []
        rounds = 0
        if self.cfg.bind and not self.pending:  # first step (or pool ran dry): a pilot-only call
            self.pending = self._run_pilots(generate, self._pilot_requests(), gen_step=step)
        while len(groups) < self.B and rounds < self.cfg.max_rounds:
            rounds += 1
            if self.cfg.bind:
                filed, self.pending = self.pending, []
            else:
                filed = self._run_pilots(generate, self._pilot_requests(), gen_step=step)
            for e in filed:
                self._file_pilot(e)
            chosen = self._select(step, rounds, self.B - len(groups), {g.prompt for g in groups})
            commits = [GenRequest(e.prompt, self.n_c, "commit") for e in chosen]
            pilots: list[GenRequest] = []
            if self.cfg.bind:
                pilots = self._pilot_requests(commits=len(commits))
            results = self._call(generate, commits + pilots)
            groups += [Group(e.prompt, e.samples + r, len(e.samples)) for e, r in zip(chosen, results, strict=False)]
            if self.cfg.bind:
                self.pending = self._entries(pilots, results[len(commits) :], step)
            self._enforce_capacity()
            if not filed and not chosen:
                break  # nothing left to pilot or commit: the pool is exhausted
        self._flush_stale(step)
        return Allocation(groups, rounds)
