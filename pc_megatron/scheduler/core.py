"""The scheduler: prompt pool, replay buffer, allocation policies, accounting.

One ``next_batch`` call fills one training batch of up to ``B`` groups, calling
``generate(requests)`` one or more times (rounds):

- ``grpo``: one round, ``B`` fresh prompts x ``n`` samples; every group is trained.
- ``dapo``: rounds of ``B_gen`` fresh prompts x ``n``; groups with zero reward spread are
  dropped, mixed groups kept until ``B``; the surplus is discarded (all generated rollouts count).
- ``pilot_commit``: pilot ``B_gen`` fresh prompts x ``n_p``; keep ``p_lower <= p̂ <= p_upper``
  in the replay buffer, evict at ``p̂ >= p_evict``, defer too-hard prompts to the next epoch,
  skip the other too-easy ones this epoch; commit ``n_c`` more samples to up to ``B`` buffered
  prompts; the trained group is pilot ∪ commit. With ``bind``, commit(t) and the pilot that
  feeds t+1 share one generate call.

Rounds repeat while the batch is short, up to ``max_rounds``; then the batch is trained as it
is (possibly empty) instead of the public recipe's hard error. Randomness is drawn from
streams keyed by (seed, epoch) and (seed, step, round), so it does not depend on call order:
bound and unbound modes see the same prompts, and a restored scheduler continues exactly.
"""

from __future__ import annotations

import math
import random
from itertools import accumulate

from pc_megatron.data.sampler import epoch_permutation
from pc_megatron.errors import ConfigError
from pc_megatron.scheduler.adaptive import Adaptive
from pc_megatron.scheduler.belief import PassRateBelief
from pc_megatron.scheduler.config import SchedulerConfig
from pc_megatron.scheduler.pilot_commit import PilotCommit, pass_rate_lower_bound
from pc_megatron.scheduler.types import Allocation, Entry, GenerateFn, GenRequest, Group, Sample

__all__ = [
    "Allocation",
    "Entry",
    "GenRequest",
    "GenerateFn",
    "Group",
    "Sample",
    "Scheduler",
    "SchedulerConfig",
    "pass_rate_lower_bound",
]

ROLLOUT_KEYS = (  # rollout counters, also kept in generated tokens
    "generated",
    "trained",
    "wasted_filtered",
    "wasted_flushed",
    "wasted_surplus",
    "wasted_degenerate",
    "generated_pilot",
    "generated_commit",
)


class Scheduler(PilotCommit, Adaptive):
    """The pool, the replay buffer and the accounting; GRPO and DAPO here, Pilot-Commit and
    adaptive in their modules."""

    def __init__(
        self, cfg: SchedulerConfig, num_prompts: int, prompts_per_step: int, samples_per_prompt: int, seed: int
    ):
        cfg.validate()
        self.cfg, self.N, self.B, self.n, self.seed = cfg, num_prompts, prompts_per_step, samples_per_prompt, seed
        self.n_p = cfg.pilot_samples or max(1, samples_per_prompt // 4)
        self.n_c = samples_per_prompt - self.n_p
        if cfg.policy == "pilot_commit" and self.n_c < 1:
            raise ConfigError(
                f"scheduler.pilot_samples={self.n_p} leaves no commit samples of n={samples_per_prompt}; "
                "make it smaller than algo.samples_per_prompt"
            )
        self.capacity = cfg.buffer_capacity or 4 * prompts_per_step
        guard = cfg.evict_min_pass_rate
        self.evict_guard = guard if guard >= 0 else (0.9 if self.n_p < 16 else 0.0)
        self.epoch, self.cursor = 0, 0
        self.state: dict[int, str] = dict.fromkeys(range(num_prompts), "fresh")
        # fresh | used (drawn this epoch) | buffered | deferred (to the next epoch) | evicted
        self.buffer: dict[int, Entry] = {}
        self.pending: list[Entry] = []  # bound mode: pilot results waiting for the next step;
        # adaptive: inconclusive pilots waiting for their extension
        self.belief = PassRateBelief(cfg.adaptive_forget)
        self.pilot_batches = 0
        self._order_cache: tuple[int, list[int]] = (-1, [])
        self.counts: dict[str, int] = dict.fromkeys(
            (
                *ROLLOUT_KEYS,
                "evicted",
                "deferred",
                "skipped_easy",
                "skipped_confident",
                "direct_groups",
                "extended",
                "groups_full",
                "degenerate_full",
                "groups_pilot",
                "degenerate_pilot",
            ),
            0,
        )
        self.tokens: dict[str, int] = dict.fromkeys(ROLLOUT_KEYS, 0)  # the same, in generated tokens
        self.n_deferred = 0  # prompts in state "deferred" (a count kept, not a scan over the pool)
        self.pilot_hist = [0] * (self.n_p + 1)  # this step's filed pilots by number correct

    def _add(self, key: str, samples: list[Sample]) -> None:
        self.counts[key] += len(samples)
        self.tokens[key] += sum(s.tokens for s in samples)

    # ------------------------------------------------------------------ pool
    def _order(self, epoch: int) -> list[int]:
        """The epoch's prompt order: a pure function of (seed, epoch), computed once per epoch."""
        if self._order_cache[0] != epoch:
            self._order_cache = (epoch, epoch_permutation(self.N, self.seed, epoch).tolist())
        return self._order_cache[1]

    def _new_epoch(self, drawn_now: list[int]) -> None:
        for e in self.buffer.values():  # the buffer is cleared at the epoch boundary
            self._add("wasted_flushed", e.samples)
        self.buffer.clear()
        self.n_deferred = 0  # every deferred prompt is fresh again
        self.epoch, self.cursor = self.epoch + 1, 0
        for p, s in self.state.items():
            if s != "evicted":
                self.state[p] = "fresh"
        for p in drawn_now:  # drawn by the call that crossed the boundary: not again in it
            self.state[p] = "used"

    def _fresh(self, k: int, exclude: frozenset[int] | set[int] = frozenset()) -> list[int]:
        """Up to k prompts not yet drawn this epoch (and not in ``exclude``: this batch's
        prompts, should the epoch wrap mid-batch); opens a new epoch when this one runs out."""
        out: list[int] = []
        started_new = False
        while len(out) < k:
            order = self._order(self.epoch)
            while self.cursor < self.N and len(out) < k:
                p = order[self.cursor]
                self.cursor += 1
                if self.state[p] == "fresh" and p not in exclude:
                    out.append(p)
                    self.state[p] = "used"  # now, so a wrap inside this call cannot draw it twice
            if len(out) < k:
                if started_new or all(s == "evicted" for s in self.state.values()):
                    break  # the whole pool is evicted or already drawn: return what there is
                self._new_epoch(out)
                started_new = True
        return out

    def _evict(self, prompt: int) -> None:
        """Out of the pool for good (solved)."""
        self.state[prompt] = "evicted"
        self.counts["evicted"] += 1

    def _defer(self, prompt: int, counted: bool = True) -> None:
        """Not drawn again this epoch (fresh at the next); ``counted``: in the ``deferred`` counter."""
        self.state[prompt] = "deferred"
        self.n_deferred += 1
        self.counts["deferred"] += counted

    def _buffer(self, entry: Entry) -> None:
        """A mixed pilot into the replay buffer, to be committed."""
        self.buffer[entry.prompt] = entry
        self.state[entry.prompt] = "buffered"

    # ------------------------------------------------------------------ policies
    def next_batch(self, step: int, generate: GenerateFn, policy_version: int = 0) -> Allocation:
        before, tokens_before = dict(self.counts), dict(self.tokens)
        self.pilot_hist = [0] * (self.n_p + 1)
        if self.cfg.policy == "grpo":
            batch = self._grpo(generate)
        elif self.cfg.policy == "dapo":
            batch = self._dapo(generate)
        else:
            batch = self._pilot_commit(step, generate) if self.cfg.policy == "pilot_commit" else None
        if self.cfg.policy == "adaptive":
            batch = self._adaptive(step, generate)
        for g in batch.groups:
            self._add("trained", g.samples)
        lags = [policy_version - s.policy_version for g in batch.groups for s in g.samples]
        ages = [step - e.gen_step for e in (*self.buffer.values(), *self.pending)]  # steps since generated
        batch.stats = {
            **{f"step_{k}": self.counts[k] - before[k] for k in self.counts},
            **{f"cum_{k}": v for k, v in self.counts.items()},
            **{f"step_tokens_{k}": self.tokens[k] - tokens_before[k] for k in self.tokens},
            **{f"cum_tokens_{k}": v for k, v in self.tokens.items()},
            "groups": len(batch.groups),
            "rounds": batch.rounds,
            "buffer_size": len(self.buffer) + len(self.pending),  # pending: bound pilots, filed next step
            "buffer_age_mean": sum(ages) / len(ages) if ages else 0.0,
            "buffer_age_max": max(ages, default=0),
            # eviction is permanent and happens once per prompt, so the cumulative count is the pool's
            "pool_active": self.N - self.counts["evicted"],
            "pool_evicted": self.counts["evicted"],
            "pool_deferred": self.n_deferred,  # back at the next epoch
            "pilot_hist": list(self.pilot_hist),
            "epoch": self.epoch,
            "max_policy_lag": max(lags, default=0),
            "mean_policy_lag": sum(lags) / len(lags) if lags else 0.0,
        }
        return batch

    def _call(self, generate: GenerateFn, requests: list[GenRequest]) -> list[list[Sample]]:
        if not requests:
            return []
        results = generate(requests)
        for req, samples in zip(requests, results, strict=True):
            if len(samples) != req.n:
                raise ValueError(f"generate returned {len(samples)} samples for prompt {req.prompt}, asked {req.n}")
            self._add("generated", samples)
            if req.phase in ("pilot", "commit"):
                self._add(f"generated_{req.phase}", samples)
            if req.phase in ("full", "pilot"):  # a degenerate group: every reward equal, zero advantage
                self.counts[f"groups_{req.phase}"] += 1
                self.counts[f"degenerate_{req.phase}"] += len({s.reward for s in samples}) == 1
        return results

    def _grpo(self, generate: GenerateFn) -> Allocation:
        prompts = self._fresh(self.B)
        results = self._call(generate, [GenRequest(p, self.n, "full") for p in prompts])
        return Allocation([Group(p, s) for p, s in zip(prompts, results, strict=True)], rounds=1)

    def _dapo(self, generate: GenerateFn) -> Allocation:
        kept: list[Group] = []
        rounds = 0
        while len(kept) < self.B and rounds < self.cfg.max_rounds:
            rounds += 1
            k = self._rounded(self.cfg.gen_prompts_multiplier * self.B)
            prompts = self._fresh(k, {g.prompt for g in kept})
            if not prompts:
                break
            for p, samples in zip(
                prompts, self._call(generate, [GenRequest(p, self.n, "full") for p in prompts]), strict=True
            ):
                if len({s.reward for s in samples}) == 1:
                    self._add("wasted_degenerate", samples)
                elif len(kept) < self.B:
                    kept.append(Group(p, samples))
                else:
                    self._add("wasted_surplus", samples)
        return Allocation(kept, rounds)

    def _select(self, step: int, rnd: int, need: int, taken: set[int], budget: float = math.inf) -> list[Entry]:
        """Up to ``need`` buffered prompts not already in this batch (an epoch can wrap mid-step
        and pilot a prompt that this batch already trains), in selection order, whose commits
        (up to n samples each) fit in ``budget`` rollouts."""
        entries = sorted((e for e in self.buffer.values() if e.prompt not in taken), key=lambda e: e.prompt)
        if len(entries) > need:
            if self.cfg.selection == "random":
                entries = random.Random(f"{self.seed}/select/{step}/{rnd}").sample(entries, need)
            else:
                entries.sort(key=lambda e: (-e.p_hat * (1 - e.p_hat), -e.seq, e.prompt))
                entries = entries[:need]
        # the running commit cost only grows, so the entries that fit are a prefix
        entries = entries[: sum(1 for total in accumulate(self.n - len(e.samples) for e in entries) if total <= budget)]
        for e in entries:
            del self.buffer[e.prompt]
            self.state[e.prompt] = "used"
        return entries

    def _drop(self, entries: list[Entry]) -> None:
        for e in entries:
            del self.buffer[e.prompt]
            self.state[e.prompt] = "used"
            self._add("wasted_flushed", e.samples)

    def _enforce_capacity(self) -> None:
        """After each round: the oldest entries beyond the capacity go first."""
        by_age = sorted(self.buffer.values(), key=lambda e: (e.seq, e.prompt))
        self._drop(by_age[: max(len(self.buffer) - self.capacity, 0)])

    def _flush_stale(self, step: int) -> None:
        """After the batch is filled: entries generated more than ``max_off_steps`` steps ago go
        (pending bound pilots were generated this step and are never stale here)."""
        self._drop([e for e in self.buffer.values() if step - e.gen_step > self.cfg.max_off_steps])

    def _rounded(self, k: int, others: int = 0) -> int:
        """``k`` plus the fewest extra prompts that make ``k + others`` a multiple of request_multiple."""
        return k + (-(k + others)) % self.cfg.request_multiple

    # ------------------------------------------------------------------ state
    def buffered_samples(self) -> int:
        return sum(len(e.samples) for e in self.buffer.values()) + sum(len(e.samples) for e in self.pending)

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "state": dict(self.state),
            "counts": dict(self.counts),
            "tokens": dict(self.tokens),
            "pilot_batches": self.pilot_batches,
            "buffer": [(e.prompt, e.samples, e.gen_step, e.seq) for e in self.buffer.values()],
            "pending": [(e.prompt, e.samples, e.gen_step, e.seq) for e in self.pending],
            "belief": self.belief.state_dict(),
        }

    def load_state_dict(self, sd: dict) -> None:
        if len(sd["state"]) != self.N:
            raise ValueError(f"scheduler state is for {len(sd['state'])} prompts, this pool has {self.N}")
        self.epoch, self.cursor = sd["epoch"], sd["cursor"]
        self.state, self.counts, self.tokens = dict(sd["state"]), dict(sd["counts"]), dict(sd["tokens"])
        self.n_deferred = sum(s == "deferred" for s in self.state.values())
        self.pilot_batches = sd["pilot_batches"]
        self.buffer = {e[0]: Entry(*e) for e in sd["buffer"]}
        self.pending = [Entry(*e) for e in sd["pending"]]
        self.belief.load_state_dict(sd["belief"])
