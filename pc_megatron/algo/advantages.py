"""GRPO group-relative advantages."""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, normalize_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Advantage of each sample relative to its group.

    ``rewards: (N,) float``, ``group_ids: (N,) int64`` (any labels). Returns ``(N,) float32``:
    ``A_i = r_i - mean_g`` and, when ``normalize_by_std`` (GRPO), divided by ``std_g + eps``
    with the unbiased (Bessel-corrected) group std, as in the GRPO paper's reference code.
    ``normalize_by_std=False`` is the Dr.GRPO variant. A group of identical rewards (or of one
    sample) gets zero advantage.
    """
    rewards = rewards.to(torch.float64)
    _, g = torch.unique(group_ids, return_inverse=True)
    num = int(g.max()) + 1 if g.numel() else 0
    count = torch.zeros(num, dtype=torch.float64, device=rewards.device).index_add_(0, g, torch.ones_like(rewards))
    mean = torch.zeros(num, dtype=torch.float64, device=rewards.device).index_add_(0, g, rewards) / count
    centered = rewards - mean[g]
    if not normalize_by_std:
        return centered.float()
    sq = torch.zeros(num, dtype=torch.float64, device=rewards.device).index_add_(0, g, centered**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return (centered / (std[g] + eps)).float()
