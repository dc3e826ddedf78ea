"""The RL update's settings: how many prompts and samples a step trains, how the batch is cut into
optimizer steps, and the policy-gradient loss (``algo.*``, ``algo.loss.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from pc_megatron.errors import ConfigError, check_choices, positive

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = get_args(Aggregation)


@dataclass
class LossConfig:
    """Policy-gradient loss settings."""

    clip_low: float = 0.2
    """Lower ratio clip epsilon (ratio >= 1 - clip_low)."""
    clip_high: float = 0.28
    """Upper ratio clip epsilon (ratio <= 1 + clip_high); > clip_low is DAPO's clip-higher."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the reference (initial) policy; 0 disables it."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus; 0 disables it."""
    normalize_adv_by_std: bool = True
    """GRPO advantage normalisation by group std; false = Dr.GRPO (mean-centering only)."""
    correction: Literal["tis", "mask", "none"] = "tis"
    """The behaviour correction: samples the learner trains were drawn by another policy than the one
    the update starts from (pilots buffered for later steps, batches made ahead under
    rollout.max_staleness, any engine/learner numerical mismatch), and each token's ratio
    rho = pi_old / pi_behaviour (pi_behaviour: the engine's log-prob when it sampled the token) says by
    how much. 'tis' (truncated importance sampling) weights the token's policy-gradient term by
    min(rho, tis_cap); 'mask' trains only the tokens with 1/tis_cap <= rho <= tis_cap (the others
    weigh 0); 'none' trains them as if on-policy, as the paper's recipe does. Reported each step as
    correction/weight_mean, correction/clipped_frac (tokens capped or masked) and correction/ess (the
    weights' effective sample size over the trained tokens, 1 = no correction needed)."""
    tis_cap: float = 2.0
    """The correction's bound C (>= 1; 2.0 as in verl and slime): the cap of 'tis', the band [1/C, C]
    of 'mask'."""
    agg: Aggregation = "token-mean"
    """How per-token losses become one loss: 'token-mean', 'seq-mean-token-mean' or
    'seq-mean-token-sum-norm' (see the module docstring); always over the whole mini-batch."""
    norm_tokens: int = 0
    """C of 'seq-mean-token-sum-norm'; 0 = rollout.max_new_tokens."""

    def validate(self) -> None:
        check_choices(self, "algo.loss")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ConfigError("algo.loss.clip_low must be in [0, 1) and clip_high >= 0")
        if self.tis_cap < 1:
            raise ConfigError(
                f"algo.loss.tis_cap={self.tis_cap}: the correction's bound must be >= 1 (2.0 is a common cap); "
                "to train without a behaviour correction set algo.loss.correction=none"
            )
        if self.norm_tokens < 0:
            raise ConfigError("algo.loss.norm_tokens must be >= 0 (0 = rollout.max_new_tokens)")


@dataclass
class AlgoConfig:
    """Allocation of rollouts and the policy-gradient update."""

    prompts_per_step: int = 32
    """B: prompts (groups) per update."""
    samples_per_prompt: int = 8
    """n: rollouts per prompt (GRPO group size)."""
    old_logprobs: Literal["fused", "separate"] = "fused"
    """Where the old policy's log-probs come from: 'fused' = the update's own forward (one
    optimizer step per batch: the old policy is the current one; saves a forward pass),
    'separate' = a forward-only pass before the update (the textbook order; same result). With
    several optimizer steps per batch the separate pass is always made."""
    skip_zero_advantage: bool = True
    """Leave the rows whose advantage is zero (every row of an all-alike group) out of the
    learner's forward and backward: their policy-gradient term is zero, so the update is the same
    (the loss is still divided by the whole mini-batch's units) at a fraction of the compute when
    many groups are degenerate. Only when nothing else acts on them (algo.loss.kl_coef and
    entropy_coef 0); at least one row per data-parallel rank is kept so every optimizer step is
    taken. Training statistics (entropy, clip fraction, log-prob mismatch) then cover the rows
    trained."""
    mini_batch_size: int = 0
    """Prompts (groups, with all their rollouts) per optimizer step: the batch's groups are cut in
    order into mini-batches of this many, one step each (verl's ppo_mini_batch_size, in prompts);
    0 = all of the step's prompts in one optimizer step."""
    mini_batch_rollouts: int = 0
    """Rollouts per optimizer step instead (0 = off; excludes mini_batch_size): the batch's rollouts
    cut in order every this many, a group possibly straddling two (advantages come from whole groups
    first). The paper's public recipe sizes its PPO mini-batch this way from the commit size (32
    prompts x n_c), so a Pilot-Commit step, which trains n_p + n_c rollouts a prompt, takes more
    optimizer steps than GRPO's; this reproduces that sizing where an experiment must."""
    epochs: int = 1
    """Passes over the step's mini-batches (PPO epochs); each pass takes every mini-batch again."""
    loss: LossConfig = field(default_factory=LossConfig)

    def validate(self) -> None:
        positive("algo.prompts_per_step", self.prompts_per_step)
        positive("algo.samples_per_prompt", self.samples_per_prompt)
        if self.mini_batch_size < 0:
            raise ConfigError("algo.mini_batch_size must be >= 0 (prompts per optimizer step; 0 = the whole batch)")
        if self.mini_batch_rollouts < 0:
            raise ConfigError("algo.mini_batch_rollouts must be >= 0 (rollouts per optimizer step; 0 = off)")
        if self.mini_batch_rollouts and self.mini_batch_size:
            raise ConfigError(
                "algo.mini_batch_size and algo.mini_batch_rollouts both size the mini-batch: set one of them"
            )
        positive("algo.epochs", self.epochs)
        self.loss.validate()
        check_choices(self, "algo")
