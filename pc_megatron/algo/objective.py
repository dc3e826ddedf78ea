"""The RL objective, in one place: truncated importance weights against the behaviour policy, the
clipped surrogate (PPO/GRPO/DAPO family), the k3 KL penalty, the entropy bonus and the aggregation
over the mini-batch. The learner runs ``rl_objective`` on each micro-batch's per-token log-probs.

For each trained token with log-prob ``logp`` under the policy being trained, ``old_logp`` under the
policy that the advantages refer to, ``behaviour_logp`` under the policy that sampled it (the
engine's) and its sequence's advantage ``A``:

    rho     = exp(old_logp - behaviour_logp)
    w       = min(rho, C)                   (correction = tis: truncated importance sampling)
            = 1 if 1/C <= rho <= C else 0   (correction = mask)
            = 1                             (correction = none)          C = tis_cap
    ratio   = exp(logp - old_logp)
    pg      = max(-w A ratio, -w A clip(ratio, 1 - clip_low, 1 + clip_high))
    kl      = exp(ref - logp) - (ref - logp) - 1                (k3 estimator, >= 0)
    loss_t  = pg + kl_coef * kl - entropy_coef * entropy

(separate low/high clip: DAPO's "clip-higher"; ``w`` is a constant that scales the token's
advantage; ``pg`` is ``kernels.grpo_loss.reference.clipped_surrogate``, the kernel's own math).

Aggregation over the update's mini-batch (``agg``), with ``n_i`` trained tokens in sequence ``i`` of
``N`` and ``C`` a constant:

    token-mean               sum_i sum_t loss_it / sum_i n_i       (DAPO; long responses weigh more)
    seq-mean-token-mean      (1/N) sum_i (1/n_i) sum_t loss_it     (GRPO's paper)
    seq-mean-token-sum-norm  sum_i sum_t loss_it / (N C)           (Dr.GRPO: C = the generation limit)

Each is ``sum_i w_i sum_t loss_it / sum_i u_i`` with a per-sequence weight ``w_i`` and unit count
``u_i`` (``aggregation_weights``). The learner hands Megatron the weighted sums and the units of each
micro-batch; Megatron divides the gradients by the units summed over every micro-batch and
data-parallel rank, so the update does not depend on how the mini-batch is cut.

The correction for the behaviour policy is one function, ``_behaviour_weights``: per-token weights
that scale the advantages, and the statistics they report (``stat_keys``): the weights' mean, the
share of tokens capped or masked, and the mean square that gives their effective sample size
``ess = mean(w)^2 / mean(w^2)`` (``effective_sample_size``).
"""

from __future__ import annotations

import torch

from kernels.grpo_loss.reference import clipped_surrogate
from pc_megatron.algo.config import AGG_MODES, LossConfig

CORRECTION_KEYS = ("correction/weight_mean", "correction/clipped_frac", "correction/weight_sq_mean")


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


def stat_keys(cfg: LossConfig) -> tuple[str, ...]:
    """The statistics ``rl_objective`` sums under ``cfg`` besides ``tokens``, in order."""
    return ("clipfrac", "entropy", "kl", *(CORRECTION_KEYS if cfg.correction != "none" else ()))


def check_inputs(cfg: LossConfig, has_behaviour_logp: bool) -> None:
    """Refuse, before any pass starts, what ``rl_objective`` would refuse in the middle of one (on the
    last pipeline stage only, where the other stages would wait for it)."""
    if cfg.correction != "none" and not has_behaviour_logp:
        raise ValueError(f"algo.loss.correction={cfg.correction} needs the behaviour (engine) log-probs")
    aggregation_weights(torch.ones(1), cfg.agg, cfg.norm_tokens)


def _behaviour_weights(
    old_logp: torch.Tensor, behaviour_logp: torch.Tensor | None, mask: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """Per-token weights ``(b, k)`` on the advantages that correct for sampling by the behaviour
    policy (None: no correction), and their statistic sums over the masked tokens."""
    if cfg.correction == "none":
        return None, {}
    if behaviour_logp is None:
        raise ValueError(f"algo.loss.correction={cfg.correction} needs the behaviour (engine) log-probs")
    rho = torch.exp(old_logp - behaviour_logp.detach())
    cap = cfg.tis_cap
    if cfg.correction == "tis":
        weight, clipped = rho.clamp(max=cap), rho > cap
    else:  # mask: the tokens out of the band weigh nothing
        clipped = (rho > cap) | (rho < 1.0 / cap)
        weight = (~clipped).to(rho.dtype)
    stats = (weight * mask).sum(), (clipped * mask).sum(), (weight.square() * mask).sum()
    return weight, dict(zip(CORRECTION_KEYS, stats, strict=True))


def effective_sample_size(weight_mean: float, weight_sq_mean: float) -> float:
    """The importance weights' effective sample size as a share of the tokens: (sum w)^2 / (N sum w^2),
    1 when every weight is equal, toward 0 when a few tokens carry the update."""
    # <= 1 (Cauchy-Schwarz); the means are float32 sums, so equal weights can round a hair above it
    return min(weight_mean**2 / weight_sq_mean, 1.0) if weight_sq_mean > 0 else 0.0


def rl_objective(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    behaviour_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    units_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The weighted loss sum of one micro-batch of ``b`` sequences, ``k`` token positions each.

    Per token, ``(b, k)`` float32 (float64 works too), on one device: ``logp`` and ``entropy`` of
    the policy being trained at the sampling temperature (the gradient flows through these two),
    ``old_logp``, ``behaviour_logp`` (needed unless ``cfg.correction`` is off), ``ref_logp`` (used when
    ``cfg.kl_coef > 0``): constants; ``mask``: 1.0 on trained tokens, 0.0 elsewhere. ``advantages``:
    ``(b,)`` per sequence (or ``(b, k)`` per token).

    Returns ``(loss_sum, units, sums)``: ``loss_sum = sum_i units_scale * w_i sum_t mask_it loss_it``,
    a differentiable 0-dim float64 (see the module docstring for ``loss_t`` and ``w_i``);
    ``units = sum_i u_i``, 0-dim float64, an integer (tokens or sequences); the loss is
    ``loss_sum / units`` summed over every micro-batch of the mini-batch. ``sums``: 0-dim tensors,
    each summed over the masked tokens: ``tokens``, ``clipfrac`` (tokens where the clip was active),
    ``entropy``, ``kl`` (0 without a KL term) and, with a correction, ``correction/weight_mean`` (the
    weights), ``correction/clipped_frac`` (tokens capped or masked) and ``correction/weight_sq_mean``
    (the squared weights); divide by ``tokens`` for means.
    ``units_scale``: the units of the rows given over those of the mini-batch they were taken from,
    when the caller leaves rows of zero loss out (the loss keeps the whole mini-batch's divisor).
    """
    old_logp = old_logp.detach()
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    weight, sums = _behaviour_weights(old_logp, behaviour_logp, mask, cfg)
    if weight is not None:
        adv = adv * weight
    ref = ref_logp.detach() if ref_logp is not None else None
    loss, clipped, kl = clipped_surrogate(logp, old_logp, adv, cfg.clip_low, cfg.clip_high, ref, cfg.kl_coef)
    if cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * entropy
    sums |= {
        "tokens": mask.sum(),
        "clipfrac": (clipped * mask).sum(),
        "entropy": (entropy.detach() * mask).sum(),
        "kl": (kl * mask).sum() if kl is not None else mask.new_zeros(()),
    }
    row_weight, row_units = aggregation_weights(mask.sum(1), cfg.agg, cfg.norm_tokens)
    weighted = (loss * mask).sum(1) * (row_weight * units_scale)
    return weighted.sum(), row_units.sum(), sums
