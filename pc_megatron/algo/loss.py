"""Clipped-surrogate policy loss (PPO/GRPO/DAPO family), per token, plus token-mean aggregation.

For each response token with log-prob ``logp`` under the policy being trained, ``old_logp``
under the policy that the advantages refer to, and advantage ``A``:

    ratio = exp(logp - old_logp)
    pg    = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))

(separate low/high clip: DAPO's "clip-higher"). Optional terms:

    kl      = exp(ref - logp) - (ref - logp) - 1      (k3 estimator, >= 0)
    loss_t  = pg + kl_coef * kl - entropy_coef * entropy

Aggregation is token-mean: the sum of ``loss_t`` over every unmasked token of the update's
mini-batch divided by their count, so long and short responses weigh per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.grpo_loss.reference import clipped_surrogate


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
    tis_cap: float = 0.0
    """Truncated importance sampling: weight each token's policy-gradient term by
    min(pi_old / pi_behaviour, tis_cap), pi_behaviour being the engine's log-probs when the
    rollout was sampled (older weights for buffered pilot rollouts, and any engine/learner
    numerical mismatch). 0 = off, as in the paper."""


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


def token_mean(values: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` divided by ``num_tokens`` (default: ``mask.sum()``, at least 1).

    Pass the mini-batch token count when summing over micro-batches, so the result equals
    the token mean over the whole mini-batch.
    """
    denom = float(mask.sum()) if num_tokens is None else float(num_tokens)
    return (values * mask).sum() / max(denom, 1.0)
