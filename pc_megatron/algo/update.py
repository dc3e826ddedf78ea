"""One RL update from the scheduler's groups: group advantages → one or more clipped-surrogate
optimizer steps over mini-batches of prompts (the objective itself, truncated IS included, is
``algo.objective.rl_objective``, which the learner's ``train_rl`` runs); and the batch's metrics.

The learner computes the old log-probs itself rather than trusting the engine's (standard in
verl and slime). With one optimizer step per batch the old policy *is* the current one, so by
default (``algo.old_logprobs=fused``) they come from the update's own forward, detached, instead
of a separate forward pass. With several steps (``algo.mini_batch_size`` below the batch's prompts,
``algo.mini_batch_rollouts`` below its rollouts, or ``algo.epochs > 1``) the old policy is the one
before the first step: a separate forward pass computes the old log-probs once, and the later steps'
ratios move away from 1, where the clip acts. Mini-batches are consecutive groups (or rollouts) in
the scheduler's order, the same order in every epoch.
The engine's log-probs measure agreement (``logprob_mismatch``, on rollouts sampled with the weights
being trained; buffered pilots and batches made ahead came from an older policy and differ by
design) and are the behaviour policy of the correction (``algo.loss.correction``: truncated
importance sampling by default, ``correction/*`` each step).
"""

from __future__ import annotations

import torch

from pc_megatron.algo.advantages import group_advantages
from pc_megatron.algo.config import AlgoConfig
from pc_megatron.algo.objective import CORRECTION_KEYS, aggregation_weights, effective_sample_size
from pc_megatron.batch import completions_to_batch, group_stats, logprob_mismatch
from pc_megatron.phases import PhaseTimes
from pc_megatron.scheduler import Group

# per-update statistics reported as their mean over the update's optimizer steps
_MEANS = ("loss", "grad_norm", "clipfrac", "entropy", "kl", *CORRECTION_KEYS, "lr")


def mini_batches(groups: list[Group], mini_batch_size: int, mini_batch_rollouts: int = 0) -> list[torch.Tensor]:
    """Row indices of each mini-batch of ``mini_batch_size`` groups (0 = all in one), rows of a group
    kept together, groups in order; or, with ``mini_batch_rollouts``, every that many rows in order."""
    sizes = [len(g.samples) for g in groups]
    if mini_batch_rollouts:
        return list(torch.arange(sum(sizes)).split(mini_batch_rollouts))
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    per = mini_batch_size or len(groups)
    return [
        torch.cat([torch.arange(starts[i], starts[i] + sizes[i]) for i in range(a, min(a + per, len(groups)))])
        for a in range(0, len(groups), per)
    ]


def rl_update(
    learner,
    ref_learner,
    groups: list[Group],
    prompt_ids: list[list[int]],
    tokenizer,
    algo: AlgoConfig,
    temperature: float,
    times: PhaseTimes,
    min_rows: int = 1,
) -> dict[str, float]:
    """Train ``learner`` (a ``LearnerRole``) on ``groups``; returns the update's metrics.

    ``algo``: the ``algo`` section, its ``loss.norm_tokens`` resolved (``algo.old_logprobs``,
    ``mini_batch_size``, ``mini_batch_rollouts``, ``epochs``, ``skip_zero_advantage``, ``loss``).
    With ``algo.skip_zero_advantage``, rows with a zero advantage (all-alike groups) stay out of the
    forward and backward when nothing but the policy-gradient term acts on them (no KL, no entropy
    bonus); the loss keeps the whole mini-batch's divisor, so the step is the one without skipping,
    and at least ``min_rows`` rows (the data-parallel size) are trained so each optimizer step happens."""
    loss_cfg, epochs = algo.loss, algo.epochs
    samples = [s for g in groups for s in g.samples]
    completions = [s.payload for s in samples]
    rewards = torch.tensor([s.reward for s in samples])
    correct = torch.tensor([s.correct for s in samples])
    group_ids = torch.cat([torch.full((len(g.samples),), i) for i, g in enumerate(groups)])
    parts = mini_batches(groups, algo.mini_batch_size, algo.mini_batch_rollouts)
    several = len(parts) * epochs > 1
    with times("logprob"):
        row_prompts = [prompt_ids[g.prompt] for g in groups for _ in g.samples]
        batch, engine_logp = completions_to_batch(row_prompts, completions, tokenizer.pad_token_id)
        separate = algo.old_logprobs == "separate" or several
        old_logp = learner.logprobs(batch, temperature) if separate else None
        ref_logp = ref_learner.logprobs(batch, temperature) if ref_learner else None
    version_before = learner.version
    updates: list[dict] = []
    trained = torch.zeros(len(samples), dtype=torch.bool)
    with times("train"):
        adv = group_advantages(rewards, group_ids, loss_cfg.normalize_adv_by_std)
        behaviour = engine_logp if loss_cfg.correction != "none" else None
        skip = algo.skip_zero_advantage and loss_cfg.kl_coef == 0 and loss_cfg.entropy_coef == 0
        row_units = aggregation_weights(batch.loss_mask.sum(1), loss_cfg.agg, loss_cfg.norm_tokens or 1)[1]
        for _ in range(epochs):
            for part in parts:
                rows = _rows_to_train(part, adv, batch.loss_mask, min_rows) if skip else part
                trained[rows] = True
                updates.append(
                    learner.train_rl(
                        batch.rows(rows),
                        _pick(old_logp, rows),
                        adv[rows],
                        loss_cfg,
                        temperature,
                        _pick(ref_logp, rows),
                        _pick(behaviour, rows),
                        units_scale=float(row_units[rows].sum() / row_units[part].sum().clamp(min=1e-12)),
                    )
                )
    times.carve("train", "optimizer", sum(u.pop("time_optimizer_s") for u in updates))
    # old_logp came from the weights before the first step
    fresh = torch.tensor([s.policy_version == version_before for s in samples], dtype=torch.float32)
    measured = batch.loss_mask * fresh[:, None]
    if old_logp is None:  # fused: the one step's own forward, over the rows it trained (the others have none)
        own = updates[0].pop("old_logp")
        old_logp = torch.zeros(batch.loss_mask.shape)
        old_logp[trained, : own.shape[1]] = own
        measured = measured * trained[:, None]
    mismatch, mismatch_max = logprob_mismatch(old_logp, engine_logp, measured)
    group_size = len(groups[0].samples)
    means = {k: sum(u[k] for u in updates) / len(updates) for k in _MEANS if k in updates[0]}
    if "correction/weight_sq_mean" in means:  # the weights' effective sample size, from their two moments
        square = means.pop("correction/weight_sq_mean")
        means["correction/ess"] = effective_sample_size(means["correction/weight_mean"], square)
    return {
        "trained_groups": len(groups),
        "reward_mean": float(rewards.mean()),
        "accuracy": float(correct.float().mean()),
        **group_stats(correct, rewards, group_size),
        "response_len_mean": float(batch.loss_mask.sum()) / len(completions),
        "frac_truncated": sum(c.finish_reason == "length" for c in completions) / len(completions),
        "logprob_mismatch": mismatch,
        "logprob_mismatch_max": mismatch_max,
        "learner/optimizer_steps": len(updates),
        **means,
        **pass_metrics(learner, ref_learner, times),
    }


def _rows_to_train(part: torch.Tensor, adv: torch.Tensor, loss_mask: torch.Tensor, min_rows: int) -> torch.Tensor:
    """``part``'s rows with a nonzero advantage and a trained token, topped up to ``min_rows`` with its
    shortest other rows, those with a trained token first (their gradient is zero: they only let
    every rank take the step)."""
    live = (adv[part] != 0) & (loss_mask[part].sum(1) > 0)
    keep = part[live]
    if len(keep) < min(min_rows, len(part)):
        rest = part[~live]
        tokens = loss_mask[rest].sum(1)
        shortest = rest[torch.where(tokens > 0, tokens, float("inf")).argsort(stable=True)]
        keep = torch.cat([keep, shortest[: min(min_rows, len(part)) - len(keep)]]).sort().values
    return keep


def _pick(t: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[rows]


def pass_metrics(learner, ref_learner, times: PhaseTimes) -> dict[str, float]:
    """What the step's learner passes computed: ``learner/pad_frac`` (share of processed positions
    that were padding, every pass), ``learner/shared_frac`` (share of the rows' tokens not laid out
    because a row shared its group's prompt: ``learner.share_prompts``), ``learner/micro_batches``
    (training micro-batches on the busiest data-parallel rank, over the step's optimizer steps) and
    tokens per second of the ``train`` and ``logprob`` phases (real tokens over the phase's own wall
    time)."""
    passes = [learner.take_pass_stats(), *([ref_learner.take_pass_stats()] if ref_learner else [])]
    total = {k: {"real_tokens": 0.0, "laid": 0.0, "processed": 0.0, "micro_batches": 0.0} for k in ("train", "logprob")}
    for p in passes:
        for kind, stats in p.items():
            for key in total[kind]:
                total[kind][key] += stats[key]
    processed = total["train"]["processed"] + total["logprob"]["processed"]
    real = total["train"]["real_tokens"] + total["logprob"]["real_tokens"]
    laid = total["train"]["laid"] + total["logprob"]["laid"]
    out = {
        "learner/pad_frac": 1.0 - laid / processed if processed else 0.0,
        "learner/shared_frac": 1.0 - laid / real if real else 0.0,
        "learner/micro_batches": total["train"]["micro_batches"],
    }
    for kind in ("train", "logprob"):
        seconds = times.seconds.get(kind, 0.0)  # train: forward and backward (the optimizer step is carved out)
        if total[kind]["real_tokens"] and seconds > 0:
            out[f"learner/{kind}_tokens_per_s"] = total[kind]["real_tokens"] / seconds
    return out
