"""Plain-PyTorch reference of the GRPO loss pieces: the CPU fallback and the test oracle.

``logprob_entropy_reference`` materialises the float32 log-softmax over the vocabulary,
which is exactly what the Triton path avoids.
"""

from __future__ import annotations

import torch


def logprob_entropy_reference(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits: (T, V)`` any float dtype, ``targets: (T,) int64`` → ``(logp, entropy)``,
    each ``(T,)`` in float32 (float64 for float64 logits: the test oracle), of
    ``softmax(logits / temperature)``."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logz = torch.logsumexp(x, dim=-1)
    logp = x.gather(-1, targets[:, None]).squeeze(-1) - logz
    entropy = logz - (torch.softmax(x, dim=-1) * x).sum(-1)
    return logp, entropy


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-token ``loss = max(-A r, -A clip(r, 1-clip_low, 1+clip_high)) + kl_coef * k3``.

    Inputs broadcast together (typically ``(T,)`` or ``(B, T)`` float32). Returns the loss,
    a float mask of tokens where the clip was active, and the k3 KL (or None).
    """
    ratio = torch.exp(logp - old_logp)
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(pg_unclipped, pg_clipped)
    clipped = (pg_clipped > pg_unclipped).float().detach()
    kl = None
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        loss = loss + kl_coef * kl
        kl = kl.detach()
    return loss, clipped, kl


def group_advantages_reference(
    rewards: torch.Tensor, group_size: int, normalize_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Contiguous groups (``rewards: (G * group_size,)``, group-major) → ``(G * group_size,)``
    float32: reward minus group mean, divided by (unbiased group std + eps) when asked."""
    r = rewards.double().view(-1, group_size)
    centered = r - r.mean(1, keepdim=True)
    if normalize_by_std:
        std = r.std(1, unbiased=True, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
        centered = centered / (std + eps)
    return centered.reshape(-1).float()
