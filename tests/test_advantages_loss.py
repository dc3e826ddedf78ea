"""GRPO advantages and the clipped-surrogate loss (pure functions, CPU)."""

import math

import torch

from pc_megatron.algo import LossConfig, group_advantages, policy_loss, token_mean


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


def test_loss_is_minus_advantage_at_ratio_one():
    logp = torch.randn(3, 5)
    adv = torch.tensor([[1.0], [-2.0], [0.5]])
    loss, stats = policy_loss(logp, logp.clone(), adv, LossConfig())
    assert torch.allclose(loss, -adv.expand(3, 5))
    assert stats["clipped"].sum() == 0


def test_clip_low_and_high_bounds_are_separate():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    old = torch.zeros(1, 4)
    # ratios 1.5 and 0.5 with positive / negative advantages
    logp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, stats = policy_loss(logp, old, adv, cfg)
    # A>0, r=1.5: clipped at 1.28 -> loss -1.28; A<0, r=1.5: unclipped 1.5 (pessimistic max)
    # A>0, r=0.5: unclipped -0.5;                A<0, r=0.5: clipped at 0.8 -> loss 0.8
    assert torch.allclose(loss, torch.tensor([[-1.28, 1.5, -0.5, 0.8]]), atol=1e-6)
    assert stats["clipped"].tolist() == [[1.0, 0.0, 0.0, 1.0]]


def test_tokens_exactly_at_clip_boundary_keep_gradient():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    logp = torch.log(torch.tensor([[1.28, 0.8]])).requires_grad_()
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), cfg)
    loss.sum().backward()
    assert torch.all(logp.grad != 0)


def test_kl_penalty_is_zero_at_reference_and_positive_elsewhere():
    cfg = LossConfig(kl_coef=0.5)
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    base, _ = policy_loss(logp, logp, torch.zeros(1, 2), cfg, ref_logp=logp)
    assert torch.allclose(base, torch.zeros(1, 2))
    off, stats = policy_loss(logp, logp, torch.zeros(1, 2), cfg, ref_logp=torch.log(torch.tensor([[0.3, 0.3]])))
    assert torch.all(stats["kl"] > 0) and torch.all(off > 0)


def test_token_mean_over_micro_batches_equals_full_token_mean():
    values, mask = torch.randn(6, 7), (torch.rand(6, 7) > 0.4).float()
    full = token_mean(values, mask)
    parts = sum(token_mean(values[i : i + 2], mask[i : i + 2], mask.sum()) for i in range(0, 6, 2))
    assert torch.allclose(full, parts)


def test_token_mean_of_fully_masked_batch_is_zero():
    assert token_mean(torch.randn(2, 3), torch.zeros(2, 3)) == 0
