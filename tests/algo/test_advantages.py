"""GRPO group advantages (``pc_megatron/algo/advantages.py``; pure functions, CPU)."""

import math

import torch

from pc_megatron.algo.advantages import group_advantages


def test_group_advantages_match_hand_computation():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = group_advantages(rewards, groups, normalize_by_std=True, eps=0.0)
    m0, s0 = 1 / 3, math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # unbiased std
    assert torch.allclose(adv[:3], torch.tensor([(1 - m0) / s0, -m0 / s0, -m0 / s0]), atol=1e-6)
    m1, s1 = 2 / 3, s0
    assert torch.allclose(adv[3:], torch.tensor([-m1 / s1, (1 - m1) / s1, (1 - m1) / s1]), atol=1e-6)


def test_dr_grpo_is_mean_centering_only():
    rewards = torch.tensor([3.0, 1.0, 5.0, 5.0])
    adv = group_advantages(rewards, torch.tensor([7, 7, 2, 2]), normalize_by_std=False)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_degenerate_groups_get_zero_advantage():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    adv = group_advantages(rewards, torch.tensor([0, 0, 0, 1, 1, 1, 2]))
    assert torch.equal(adv, torch.zeros(7))
