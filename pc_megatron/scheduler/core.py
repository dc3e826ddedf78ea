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
from dataclasses import dataclass
from itertools import accumulate

from pc_megatron.data.sampler import epoch_permutation
from pc_megatron.scheduler.adaptive import Adaptive
from pc_megatron.scheduler.belief import PassRateBelief
from pc_megatron.scheduler.pilot_commit import PilotCommit, pass_rate_lower_bound
from pc_megatron.scheduler.types import Allocation, Entry, GenerateFn, GenRequest, Group, Sample

__all__ = [
    "POLICIES",
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

POLICIES = ("grpo", "dapo", "pilot_commit", "adaptive")
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


@dataclass
class SchedulerConfig:
    """Rollout allocation."""

    policy: str = "grpo"
    """'grpo' (uniform), 'dapo' (dynamic sampling), 'pilot_commit' (the paper's) or 'adaptive'
    (pilots sized and skipped by what the run knows; see the module docstring)."""
    gen_prompts_multiplier: int = 3
    """B_gen = multiplier x B fresh prompts per DAPO / pilot round."""
    pilot_samples: int = 0
    """n_p; 0 = n / 4 (the recipe's 32 of 128, 16 of 64)."""
    p_lower: float = 0.125
    """Keep pilots with p̂ >= p_lower (inclusive); below: deferred to the next epoch."""
    p_upper: float = 0.75
    """Keep pilots with p̂ <= p_upper (inclusive); above: skipped this epoch."""
    p_evict: float = 1.0
    """Evict permanently at p̂ >= p_evict (1.0 = all pilot samples correct; > 1 = never evict)."""
    evict_min_pass_rate: float = -1.0
    """Also require the pilot to show, with 95% confidence (Clopper-Pearson lower bound), a pass
    rate of at least this before evicting; 0 = the recipe's rule alone. With 0.9, an all-correct
    pilot of 32 evicts (bound 0.911, the recipe's behaviour at n=128) but one of 2 or 8 does not
    (bounds 0.22, 0.69): a small pilot cannot tell p = 0.9 from p = 1 (8 of 8 happens to 43% of
    p = 0.9 prompts), and evicting those removed prompts the model still needed (the default
    recipe's n = 8 run ended below its start). -1 (default) = scaled with the pilot: 0.9 below 16
    pilot samples, the recipe's rule (0) from 16 on."""
    buffer_capacity: int = 0
    """Replay-buffer size cap, enforced after each round (oldest dropped first); 0 = 4 x B."""
    max_off_steps: int = 4
    """After step t's batch, flush buffered pilots generated before step t - max_off_steps (the
    recipe's rule), so a trained pilot is at most max_off_steps + 1 policy versions old."""
    selection: str = "max_variance"
    """Commit order: 'random' or 'max_variance' (p̂(1-p̂) high first, ties to the most recent)."""
    bind: bool = True
    """Put commit(t) and pilot(t+1) in one generate call."""
    max_rounds: int = 10
    """Generate rounds per batch before training on what there is."""
    adaptive_pilot: int = 4
    """adaptive: first pilot size; a degenerate, inconclusive pilot is extended by as many
    samples again, up to pilot_samples."""
    adaptive_skip_below: float = 0.2
    """adaptive: a prompt whose n-sample group would be mixed with probability below this (its
    posterior says solved or hopeless) is not piloted this epoch (deferred)."""
    adaptive_direct_above: float = 0.8
    """adaptive: a prompt whose n-sample group would be mixed with probability at least this gets
    a full group of n without a pilot (GRPO's allocation, where the pool is informative)."""
    adaptive_explore: float = 0.05
    """adaptive: share of skip decisions overridden by a pilot (the policy moves)."""
    adaptive_forget: float = 0.97
    """adaptive: a sample's weight in a prompt's evidence decays by this per policy step."""
    adaptive_evict_confidence: float = 0.95
    """adaptive: evict a prompt only when P(all n samples correct) is at least this."""
    adaptive_budget: float = 1.0
    """adaptive: generate at most this x B x n rollouts per update (1 = GRPO's), training the groups
    that fit (possibly fewer than B, nearly all mixed); mixed pilots left over wait in the buffer.
    0 = no cap: pilot until B groups are full, which spent 1.2-1.5x GRPO's rollouts per update and
    lost to GRPO where updates, not informative groups, limit learning (docs/regime_map.md).
    Replica-filling pilots (request_multiple) may exceed it by less than one replica's share."""
    request_multiple: int = 1
    """Round each generate call's prompt count up to a multiple of this (the rollout engine's
    data-parallel size, so every replica gets the same number of prompts) by piloting (DAPO:
    sampling) extra fresh prompts. GRPO calls (B prompts) and unbound commit-only calls are left
    as they are. 1 = off."""

    def validate(self) -> None:
        from pc_megatron.errors import ConfigError

        if self.policy not in POLICIES:
            raise ConfigError(f"scheduler.policy: '{self.policy}' is not one of {', '.join(POLICIES)}")
        if self.selection not in ("random", "max_variance"):
            raise ConfigError(f"scheduler.selection: '{self.selection}' is not one of random, max_variance")
        if not 0 <= self.p_lower <= self.p_upper <= 1 or self.p_evict <= self.p_upper:
            raise ConfigError("scheduler: need 0 <= p_lower <= p_upper <= 1 and p_evict > p_upper (> 1: never evict)")
        if self.gen_prompts_multiplier < 1 or self.max_rounds < 1 or self.max_off_steps < 0:
            raise ConfigError("scheduler: gen_prompts_multiplier and max_rounds must be >= 1, max_off_steps >= 0")
        if not (0 <= self.evict_min_pass_rate <= 1 or self.evict_min_pass_rate == -1):
            raise ConfigError(
                "scheduler.evict_min_pass_rate must be in [0, 1] (0 = the recipe's eviction rule) or -1 (scaled with n)"
            )
        if not (1 <= self.adaptive_pilot and 0 <= self.adaptive_skip_below <= self.adaptive_direct_above <= 1):
            raise ConfigError(
                "scheduler: need adaptive_pilot >= 1 and 0 <= adaptive_skip_below <= adaptive_direct_above <= 1"
            )
        if not (0 <= self.adaptive_explore <= 1 and 0 < self.adaptive_forget <= 1):
            raise ConfigError("scheduler: need adaptive_explore in [0, 1] and adaptive_forget in (0, 1]")
        if self.adaptive_budget < 0:
            raise ConfigError(
                "scheduler.adaptive_budget must be >= 0 (a multiple of GRPO's B x n rollouts per update; 0 = no cap)"
            )
        if self.request_multiple < 1:
            raise ConfigError("scheduler.request_multiple must be >= 1 (the engine's data-parallel size; 1 = off)")


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
            from pc_megatron.errors import ConfigError

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
