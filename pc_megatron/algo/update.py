"""One RL update from the scheduler's groups: group advantages → one clipped-surrogate optimizer
step (the objective itself, truncated IS included, is the learner's ``train_rl``); and the
batch's metrics.

The learner computes the old log-probs itself rather than trusting the engine's (standard in
verl and slime). With one optimizer step per batch the old policy *is* the current one, so by
default (``algo.old_logprobs=fused``) they come from the update's own forward, detached, instead
of a separate forward pass (verl and slime make that pass because they take several
mini-batch steps). The engine's log-probs serve only to measure agreement
(``logprob_mismatch``, on rollouts sampled with the weights being trained; buffered pilots came
from an older policy and differ by design) and, with ``algo.loss.tis_cap``, as the behaviour
policy of truncated importance sampling.
"""

from __future__ import annotations

import dataclasses

import torch

from pc_megatron.algo.advantages import group_advantages
from pc_megatron.algo.loss import LossConfig
from pc_megatron.rollout.batch import completions_to_batch, group_stats, logprob_mismatch
from pc_megatron.rollout.worker import PhaseTimes
from pc_megatron.scheduler import Group


def rl_update(
    learner,
    ref_learner,
    groups: list[Group],
    prompt_ids: list[list[int]],
    tokenizer,
    loss_cfg: LossConfig,
    temperature: float,
    times: PhaseTimes,
    separate_old_logprobs: bool = False,
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
        old_logp = learner.logprobs(batch, temperature) if separate_old_logprobs else None
        ref_logp = ref_learner.logprobs(batch, temperature) if ref_learner else None
    with times("train"):
        adv = group_advantages(rewards, group_ids, loss_cfg.normalize_adv_by_std)
        behaviour = engine_logp if loss_cfg.tis_cap > 0 else None
        stats = learner.train_rl(batch, old_logp, adv, loss_cfg, temperature, ref_logp, behaviour)
    times.carve("train", "optimizer", stats.pop("time_optimizer_s"))
    if old_logp is None:
        old_logp = stats.pop("old_logp")
    # the learner's version is now one past the weights that gave old_logp
    fresh = torch.tensor([s.policy_version == learner.version - 1 for s in samples], dtype=torch.float32)
    mismatch, mismatch_max = logprob_mismatch(old_logp, engine_logp, batch.loss_mask * fresh[:, None])
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
        **stats,
    }
