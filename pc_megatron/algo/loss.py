"""Clipped-surrogate policy loss (PPO/GRPO/DAPO family), per token, and how it is aggregated.

For each response token with log-prob ``logp`` under the policy being trained, ``old_logp``
under the policy that the advantages refer to, and advantage ``A``:

    ratio = exp(logp - old_logp)
    pg    = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))

(separate low/high clip: DAPO's "clip-higher"). Optional terms:

    kl      = exp(ref - logp) - (ref - logp) - 1      (k3 estimator, >= 0)
    loss_t  = pg + kl_coef * kl - entropy_coef * entropy

Aggregation over the update's mini-batch (``agg``), with ``n_i`` trained tokens in sequence ``i`` of
``N`` and ``C`` a constant:

    token-mean               sum_i sum_t loss_it / sum_i n_i       (DAPO; long responses weigh more)
    seq-mean-token-mean      (1/N) sum_i (1/n_i) sum_t loss_it     (GRPO's paper)
    seq-mean-token-sum-norm  sum_i sum_t loss_it / (N C)           (Dr.GRPO: C = the generation limit)

Each is ``sum_i w_i sum_t loss_it / sum_i u_i`` with a per-sequence weight ``w_i`` and unit count
``u_i`` (``aggregation_weights``). The learner hands Megatron the weighted sums and the units of each
micro-batch; Megatron divides the gradients by the units summed over every micro-batch and
data-parallel rank, so the update does not depend on how the mini-batch is cut.
"""

from __future__ import annotations

import torch

from kernels.grpo_loss.reference import clipped_surrogate
from pc_megatron.algo.config import AGG_MODES, LossConfig


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    cfg: LossConfig,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss and per-token diagnostics.

    All inputs ``(B, T)`` float32 (``advantages`` may be ``(B, 1)``). Returns ``loss: (B, T)``
    and a dict of ``(B, T)`` tensors: ``clipped`` (1.0 where the clip was active), ``ratio``,
    ``kl`` (when ``ref_logp`` is given).
    """
    loss, clipped, kl = clipped_surrogate(
        logp, old_logp, advantages, cfg.clip_low, cfg.clip_high, ref_logp, cfg.kl_coef
    )
    stats = {"clipped": clipped, "ratio": torch.exp(logp - old_logp).detach()}
    if kl is not None:
        stats["kl"] = kl
    if entropy is not None and cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * entropy
    return loss, stats


def aggregation_weights(
    token_counts: torch.Tensor, agg: str, norm_tokens: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_counts: (N,)`` trained tokens per sequence -> ``(w, u)`` each ``(N,) float64`` such that
    the aggregated loss is ``sum_i w_i sum_t loss_it / sum_i u_i``. A sequence with no trained token
    weighs nothing and counts no unit."""
    n = token_counts.double()
    has = (n > 0).double()
    if agg == "token-mean":
        return has, n
    if agg == "seq-mean-token-mean":
        return has / n.clamp(min=1), has
    if agg == "seq-mean-token-sum-norm":
        if norm_tokens < 1:
            raise ValueError("seq-mean-token-sum-norm needs norm_tokens >= 1 (the generation limit)")
        return has / norm_tokens, has
    raise ValueError(f"unknown aggregation {agg!r}; one of {', '.join(AGG_MODES)}")
