"""GRPO advantages and the clipped-surrogate loss (pure functions, CPU)."""

import itertools
import math

import pytest
import torch

from pc_megatron.algo import LossConfig, aggregation_weights, group_advantages, rl_objective


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


def _token_losses(logp, old, adv, cfg, ref_logp=None):
    """Each token's loss, clip flag and KL through ``rl_objective``, one token trained at a time
    (token-mean: that token's loss is the loss sum)."""
    out = {key: torch.zeros(logp.shape, dtype=torch.float64) for key in ("loss", "clipped", "kl")}
    for i, t in itertools.product(range(logp.shape[0]), range(logp.shape[1])):
        mask = torch.zeros(logp.shape)
        mask[i, t] = 1.0
        loss, units, sums = rl_objective(logp, torch.zeros(logp.shape), old, adv, mask, cfg, ref_logp=ref_logp)
        assert units == 1
        out["loss"][i, t], out["clipped"][i, t], out["kl"][i, t] = loss, sums["clipfrac"], sums["kl"]
    return out


def test_loss_is_minus_advantage_at_ratio_one():
    logp = torch.randn(3, 5)
    adv = torch.tensor([[1.0], [-2.0], [0.5]])
    got = _token_losses(logp, logp.clone(), adv, LossConfig())
    assert torch.allclose(got["loss"], -adv.expand(3, 5).double())
    assert got["clipped"].sum() == 0


def test_clip_low_and_high_bounds_are_separate():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    old = torch.zeros(1, 4)
    # ratios 1.5 and 0.5 with positive / negative advantages
    logp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    got = _token_losses(logp, old, adv, cfg)
    # A>0, r=1.5: clipped at 1.28 -> loss -1.28; A<0, r=1.5: unclipped 1.5 (pessimistic max)
    # A>0, r=0.5: unclipped -0.5;                A<0, r=0.5: clipped at 0.8 -> loss 0.8
    assert torch.allclose(got["loss"], torch.tensor([[-1.28, 1.5, -0.5, 0.8]], dtype=torch.float64), atol=1e-6)
    assert got["clipped"].tolist() == [[1.0, 0.0, 0.0, 1.0]]


def test_tokens_exactly_at_clip_boundary_keep_gradient():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    logp = torch.log(torch.tensor([[1.28, 0.8]])).requires_grad_()
    loss, _, _ = rl_objective(
        logp, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), cfg
    )
    loss.backward()
    assert torch.all(logp.grad != 0)


def test_kl_penalty_is_zero_at_reference_and_positive_elsewhere():
    cfg = LossConfig(kl_coef=0.5)
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    base = _token_losses(logp, logp, torch.zeros(1, 2), cfg, ref_logp=logp)
    assert torch.allclose(base["loss"], torch.zeros(1, 2, dtype=torch.float64))
    off = _token_losses(logp, logp, torch.zeros(1, 2), cfg, ref_logp=torch.log(torch.tensor([[0.3, 0.3]])))
    assert torch.all(off["kl"] > 0) and torch.all(off["loss"] > 0)


def _aggregate(loss: torch.Tensor, mask: torch.Tensor, agg: str, norm: int = 0, parts: int = 1) -> float:
    """The loss as the learner forms it: weighted sums and units per micro-batch, one global ratio."""
    w, u = aggregation_weights(mask.sum(1), agg, norm)
    total, units = 0.0, 0.0
    for rows in torch.arange(len(loss)).chunk(parts):
        total += float(((loss[rows] * mask[rows]).sum(1).double() * w[rows]).sum())
        units += float(u[rows].sum())
    return total / units


def test_each_aggregation_mode_matches_its_hand_computed_value():
    """Three sequences of 3, 1 and 2 trained tokens (and one with none) with known per-token losses."""
    loss = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [5.0, 7.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    assert _aggregate(loss, mask, "token-mean") == pytest.approx((1 + 2 + 3 + 4 + 5 + 7) / 6)
    assert _aggregate(loss, mask, "seq-mean-token-mean") == pytest.approx((6 / 3 + 4 / 1 + 12 / 2) / 3)
    assert _aggregate(loss, mask, "seq-mean-token-sum-norm", norm=8) == pytest.approx((6 + 4 + 12) / (3 * 8))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_does_not_depend_on_how_the_batch_is_cut(agg):
    loss, mask = torch.randn(12, 9), (torch.rand(12, 9) > 0.4).float()
    whole = _aggregate(loss, mask, agg, norm=9)
    for parts in (2, 3, 12):
        assert _aggregate(loss, mask, agg, norm=9, parts=parts) == pytest.approx(whole, rel=1e-12)
    if agg == "token-mean":  # the negative control: a token mean per micro-batch, then their mean
        per_part = [_aggregate(loss[r], mask[r], agg) for r in torch.arange(12).chunk(3)]
        assert abs(sum(per_part) / 3 - whole) > 1e-6


def test_sum_norm_without_a_constant_is_refused():
    with pytest.raises(ValueError, match="norm_tokens"):
        aggregation_weights(torch.tensor([3.0]), "seq-mean-token-sum-norm", 0)
