"""The scheduler's settings (``scheduler.*``): which allocation policy, and the knobs of each.

The choices are ``Literal`` types, so the config loader rejects a bad one when a recipe or an override is
read (``pc_megatron/config.py`` names the choices); ``validate`` says the same for a config built in
code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from pc_megatron.errors import ConfigError, check_choices

PolicyName = Literal["grpo", "dapo", "pilot_commit", "adaptive"]
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)
Selection = Literal["random", "max_variance"]


@dataclass
class SchedulerConfig:
    """Rollout allocation."""

    policy: PolicyName = "grpo"
    """'grpo' (uniform), 'dapo' (dynamic sampling), 'pilot_commit' (the paper's) or 'adaptive'
    (pilots sized and skipped by what the run knows; see ``pc_megatron/scheduler/__init__.py``)."""
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
    selection: Selection = "max_variance"
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
    lost to GRPO where updates, not informative groups, limit learning (docs/results/regime_map.md).
    Replica-filling pilots (request_multiple) may exceed it by less than one replica's share."""
    request_multiple: int = 1
    """Round each generate call's prompt count up to a multiple of this (the rollout engine's
    data-parallel size, so every replica gets the same number of prompts) by piloting (DAPO:
    sampling) extra fresh prompts. GRPO calls (B prompts) and unbound commit-only calls are left
    as they are. 1 = off."""
    stream: bool = True
    """Unbound Pilot-Commit rounds (``bind=false``): start a prompt's commit as soon as its pilot is
    scored and the round's selection is sure to take it, in the same generate window as the pilots
    still running, where the engine streams (``rollout.backend=vllm`` under ``runtime=local``); the
    same commits as with a barrier between pilot and commit. false = the barrier."""

    def pilot_size(self, samples_per_prompt: int) -> int:
        """n_p: ``pilot_samples``, or a quarter of n (at least 1) when it is 0."""
        return self.pilot_samples or max(1, samples_per_prompt // 4)

    def validate(self) -> None:
        check_choices(self, "scheduler")
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
