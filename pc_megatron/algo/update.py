"""One RL update from the scheduler's groups: old log-probs → engine agreement → truncated IS
weights → group advantages → one clipped-surrogate optimizer step; and the batch's metrics.

The learner computes the old log-probs itself rather than trusting the engine's (standard in
verl and slime): the engine's serve only to measure agreement (``logprob_mismatch``, on rollouts
sampled with the learner's current weights; buffered pilots came from an older policy and differ
by design) and, with ``algo.loss.tis_cap``, as the behaviour policy of truncated importance
sampling.
"""

from __future__ import annotations

import dataclasses

import torch

from pc_megatron.algo.advantages import group_advantages
from pc_megatron.algo.loss import LossConfig
from pc_megatron.rollout.batch import completions_to_batch, group_stats, logprob_mismatch
from pc_megatron.rollout.worker import PhaseTimes
from pc_megatron.scheduler import Group


def tis_weights(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``min(pi_old / pi_engine, cap)`` per token, with the mean weight and the truncated share."""
    raw = torch.exp(old_logp - engine_logp)
    n_tok = max(float(mask.sum()), 1.0)
    stats = {
        "tis_weight_mean": float((raw.clamp(max=cap) * mask).sum()) / n_tok,
        "tis_truncated_frac": float(((raw > cap) * mask).sum()) / n_tok,
    }
    return raw.clamp(max=cap), stats


def rl_update(
    learner,
    ref_learner,
    groups: list[Group],
    prompt_ids: list[list[int]],
    tokenizer,
    loss_cfg: LossConfig,
    temperature: float,
    times: PhaseTimes,
) -> dict[str, float]:
    """Train ``learner`` (a ``LearnerRole``) on ``groups``; returns the update's metrics."""
    samples = [s for g in groups for s in g.samples]
    completions = [dataclasses.replace(s.payload, prompt_index=i) for i, g in enumerate(groups) for s in g.samples]
    rewards = torch.tensor([s.reward for s in samples])
    correct = torch.tensor([s.correct for s in samples])
    group_ids = torch.cat([torch.full((len(g.samples),), i) for i, g in enumerate(groups)])
    with times("logprob"):
        batch, engine_logp = completions_to_batch(
            [prompt_ids[g.prompt] for g in groups], completions, tokenizer.pad_token_id
        )
        old_logp = learner.logprobs(batch, temperature)
        ref_logp = ref_learner.logprobs(batch, temperature) if ref_learner else None
    fresh = torch.tensor([s.policy_version == learner.version for s in samples], dtype=torch.float32)
    mismatch, mismatch_max = logprob_mismatch(old_logp, engine_logp, batch.loss_mask * fresh[:, None])
    is_weight, tis = None, {}
    if loss_cfg.tis_cap > 0:
        is_weight, tis = tis_weights(old_logp, engine_logp, batch.loss_mask, loss_cfg.tis_cap)
    with times("train"):
        adv = group_advantages(rewards, group_ids, loss_cfg.normalize_adv_by_std)
        stats = learner.train_rl(batch, old_logp, adv, loss_cfg, temperature, ref_logp, is_weight)
    group_size = len(groups[0].samples)
    return {
        "trained_groups": len(groups),
        "reward_mean": float(rewards.mean()),
        "accuracy": float(correct.float().mean()),
        **group_stats(correct, rewards, group_size),
        "response_len_mean": float(batch.loss_mask.sum()) / len(completions),
        "frac_truncated": sum(c.finish_reason == "length" for c in completions) / len(completions),
        "logprob_mismatch": mismatch,
        "logprob_mismatch_max": mismatch_max,
        **tis,
        **stats,
    }
