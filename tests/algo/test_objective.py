"""algo.objective.rl_objective (CPU): against the GRPO kernel's reference, against a float64 hand
computation for every aggregation with truncated IS, KL and entropy each on and off, and its
gradient against finite differences; the clipped surrogate token by token (ratio one, the two clip
bounds, KL), and loss aggregation that does not depend on how a batch is cut."""

import itertools
import math

import pytest
import torch

from kernels.grpo_loss import grpo_loss
from kernels.grpo_loss.reference import clipped_surrogate, logprob_entropy_reference
from pc_megatron.algo.config import AGG_MODES, LossConfig
from pc_megatron.algo.objective import (
    CORRECTION_KEYS,
    aggregation_weights,
    check_inputs,
    effective_sample_size,
    rl_objective,
    stat_keys,
)

B, K = 5, 7


def _inputs(dtype=torch.float64, seed=0) -> dict[str, torch.Tensor]:
    """Per-token inputs of B rows x K positions: ratios on both sides of both clip bounds (none within
    0.02 of one), IS weights above and below a cap of 2, ragged masks, a row of one trained token and one of none."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, K, generator=g, dtype=torch.float64) * 3
    steps = torch.tensor([-0.6, -0.1, 0.05, 0.5, -0.4, 0.15, 0.35], dtype=torch.float64)
    noise = (torch.rand(B, K, generator=g, dtype=torch.float64) - 0.5) * 0.04
    logp = old + steps[(torch.arange(B * K) % len(steps)).view(B, K)] + noise
    behaviour = old - (torch.rand(B, K, generator=g, dtype=torch.float64) * 2 - 0.8)
    mask = (torch.rand(B, K, generator=g) > 0.3).double()
    mask[:, 0] = 1.0
    mask[3] = 0.0
    mask[4, 1:] = 0.0  # one trained token
    out = {
        "logp": logp,
        "entropy": torch.rand(B, K, generator=g, dtype=torch.float64) * 2,
        "old_logp": old,
        "advantages": torch.tensor([1.0, -0.7, 0.4, 2.0, -1.3], dtype=torch.float64),
        "mask": mask,
        "behaviour_logp": behaviour,
        "ref_logp": old + (torch.rand(B, K, generator=g, dtype=torch.float64) - 0.5),
    }
    return {k: v.to(dtype) for k, v in out.items()}


def _by_hand(x: dict[str, torch.Tensor], cfg: LossConfig, units_scale: float) -> tuple[float, float, dict]:
    """The module docstring's formulas, token by token in Python floats."""
    t = {k: v.tolist() for k, v in x.items()}
    total, units = 0.0, 0.0
    keys = ("tokens", "clipfrac", "entropy", "kl", *CORRECTION_KEYS)
    sums = dict.fromkeys(keys, 0.0)
    for i in range(B):
        row, n = 0.0, sum(t["mask"][i])
        for j in range(K):
            if not t["mask"][i][j]:
                continue
            lp, old = t["logp"][i][j], t["old_logp"][i][j]
            w = 1.0
            if cfg.correction != "none":
                rho = math.exp(old - t["behaviour_logp"][i][j])
                if cfg.correction == "tis":
                    w, out = min(rho, cfg.tis_cap), rho > cfg.tis_cap
                else:
                    out = not 1 / cfg.tis_cap <= rho <= cfg.tis_cap
                    w = 0.0 if out else 1.0
                sums["correction/weight_mean"] += w
                sums["correction/clipped_frac"] += out
                sums["correction/weight_sq_mean"] += w * w
            a, r = t["advantages"][i] * w, math.exp(lp - old)
            unclipped, clipped = -a * r, -a * min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high)
            loss = max(unclipped, clipped)
            if cfg.kl_coef > 0:
                d = t["ref_logp"][i][j] - lp
                kl = math.exp(d) - d - 1
                loss += cfg.kl_coef * kl
                sums["kl"] += kl
            loss -= cfg.entropy_coef * t["entropy"][i][j]
            row += loss
            sums["tokens"] += 1
            sums["clipfrac"] += clipped > unclipped
            sums["entropy"] += t["entropy"][i][j]
        if n:
            weight, unit = {
                "token-mean": (1, n),
                "seq-mean-token-mean": (1 / n, 1),
                "seq-mean-token-sum-norm": (1 / 9, 1),
            }[cfg.agg]
            total += units_scale * weight * row
            units += unit
    return total, units, sums


@pytest.mark.parametrize(
    ("agg", "correction", "kl", "entropy"), itertools.product(AGG_MODES, ("none", "tis", "mask"), *[(False, True)] * 2)
)
def test_objective_matches_a_float64_hand_computation(agg, correction, kl, entropy):
    cfg = LossConfig(
        agg=agg, norm_tokens=9, correction=correction, kl_coef=0.1 if kl else 0.0, entropy_coef=0.01 * entropy
    )
    x = _inputs()
    scale = 0.75 if correction != "none" else 1.0
    loss, units, sums = rl_objective(**x, cfg=cfg, units_scale=scale)
    want_loss, want_units, want = _by_hand(x, cfg, scale)
    assert loss.dtype == units.dtype == torch.float64
    assert float(loss) == pytest.approx(want_loss, rel=1e-12, abs=1e-14)
    assert float(units) == want_units
    assert set(sums) == {"tokens", *stat_keys(cfg)}
    for key, value in sums.items():
        assert float(value) == pytest.approx(want[key], rel=1e-12, abs=1e-14), key
    if correction != "none":  # the cases bite: some weights capped (or masked), some not; some tokens clipped
        assert 0 < want["correction/clipped_frac"] < want["tokens"]
    assert 0 < want["clipfrac"] < want["tokens"]


@pytest.mark.parametrize("agg", AGG_MODES)
def test_objective_is_the_kernel_reference_math(agg):
    """float32 as in the learner: per token, the loss is kernels.grpo_loss.reference.clipped_surrogate's
    (KL included); aggregated, its token mean is grpo_loss's, with the same gradient w.r.t. the logits."""
    g = torch.Generator().manual_seed(1)
    x = _inputs(torch.float32, seed=2)
    logits = torch.randn(B * K, 13, generator=g, requires_grad=True)
    targets = torch.randint(0, 13, (B * K,), generator=g)
    logp, entropy = logprob_entropy_reference(logits, targets, 0.9)
    logp, entropy = logp.view(B, K), entropy.view(B, K)
    adv = x["advantages"][:, None].expand(B, K)
    cfg = LossConfig(agg=agg, norm_tokens=9, kl_coef=0.2, correction="none")
    loss, units, sums = rl_objective(logp, entropy, x["old_logp"], adv, x["mask"], cfg, ref_logp=x["ref_logp"])
    per_token, clipped, kl = clipped_surrogate(logp, x["old_logp"], adv, 0.2, 0.28, x["ref_logp"], 0.2)
    w, u = aggregation_weights(x["mask"].sum(1), agg, 9)
    assert torch.equal(loss, ((per_token * x["mask"]).sum(1) * w).sum()) and torch.equal(units, u.sum())
    assert torch.equal(sums["clipfrac"], (clipped * x["mask"]).sum()) and torch.equal(
        sums["kl"], (kl * x["mask"]).sum()
    )
    if agg != "token-mean":
        return
    (ours,) = torch.autograd.grad(loss / units, logits)
    flat = [x["old_logp"].flatten(), adv.flatten(), x["mask"].flatten()]
    ref = grpo_loss(logits, targets, *flat, 0.9, ref_logp=x["ref_logp"].flatten(), kl_coef=0.2, impl="torch")
    (theirs,) = torch.autograd.grad(ref.loss, logits)
    assert float((loss / units).detach()) == pytest.approx(float(ref.loss.detach()), rel=1e-6)
    assert float(sums["clipfrac"] / sums["tokens"]) == pytest.approx(float(ref.clipfrac), rel=1e-6)
    assert torch.allclose(ours.float(), theirs, rtol=1e-5, atol=1e-8) and theirs.abs().max() > 0


@pytest.mark.parametrize("agg", AGG_MODES)
def test_objective_gradient_matches_finite_differences(agg):
    """float64, everything on (TIS, KL, entropy bonus, a units scale): autograd w.r.t. the log-probs
    and the entropy against central differences (no token within reach of a clip bound)."""
    x = _inputs()
    cfg = LossConfig(agg=agg, norm_tokens=9, tis_cap=2.0, kl_coef=0.1, entropy_coef=0.01)
    rest = {k: v for k, v in x.items() if k not in ("logp", "entropy")}

    def f(logp, entropy):
        return rl_objective(logp, entropy, **rest, cfg=cfg, units_scale=0.5)[0]

    inputs = (x["logp"].clone().requires_grad_(), x["entropy"].clone().requires_grad_())
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)
    (grad,) = torch.autograd.grad(f(*inputs), inputs[0])
    assert (grad[x["mask"] == 0] == 0).all() and (grad[x["mask"] == 1] != 0).sum() > B


@pytest.mark.parametrize("agg", AGG_MODES)
def test_cut_batches_and_dropped_zero_rows_give_the_whole_batchs_loss(agg):
    """Summed over any cut of the rows, loss sums and units are the whole batch's; rows of zero
    advantage left out with units_scale (their units over the mini-batch's) keep the same loss."""
    x = _inputs()
    cfg = LossConfig(agg=agg, norm_tokens=9)
    loss, units, _ = rl_objective(**x, cfg=cfg)
    for parts in (2, 3, B):
        cut = [rl_objective(**{k: v[r] for k, v in x.items()}, cfg=cfg) for r in torch.arange(B).chunk(parts)]
        assert float(sum(c[0] for c in cut)) == pytest.approx(float(loss), rel=1e-12)
        assert float(sum(c[1] for c in cut)) == float(units)
    x["advantages"][[1, 4]] = 0.0
    loss, units, _ = rl_objective(**x, cfg=cfg)
    keep = torch.tensor([0, 2, 3])
    kept = {k: v[keep] for k, v in x.items()}
    scale = float(aggregation_weights(kept["mask"].sum(1), agg, 9)[1].sum() / units)
    part, part_units, _ = rl_objective(**kept, cfg=cfg, units_scale=scale)
    assert float(part / part_units) == pytest.approx(float(loss / units), rel=1e-12) and float(loss) != 0


def test_the_correction_is_on_by_default_and_weighs_each_token_by_its_behaviour_ratio():
    """tis: w = min(rho, C); mask: the tokens outside [1/C, C] weigh nothing; with every ratio one
    (the engine sampled with the weights being trained) no token moves and the ESS is 1; none
    ignores the behaviour policy."""
    assert LossConfig().correction == "tis" and LossConfig().tis_cap == 2.0
    x = _inputs()
    rho = torch.exp(x["old_logp"] - x["behaviour_logp"])
    on = x["mask"] == 1
    for correction, weight in (
        ("tis", rho.clamp(max=2.0)),
        ("mask", ((rho >= 0.5) & (rho <= 2.0)).double()),
    ):
        _, _, sums = rl_objective(**x, cfg=LossConfig(correction=correction))
        assert float(sums["correction/weight_mean"]) == pytest.approx(float(weight[on].sum()), rel=1e-12)
        mean, square = weight[on].mean(), weight[on].square().mean()
        ess = effective_sample_size(float(mean), float(square))
        assert ess == pytest.approx(float(weight[on].sum() ** 2 / (on.sum() * weight[on].square().sum())))
        assert 0 < ess < 1  # unequal weights: fewer effective tokens
    on_policy = dict(x, behaviour_logp=x["old_logp"].clone())
    _, _, sums = rl_objective(**on_policy, cfg=LossConfig(correction="mask"))
    assert float(sums["correction/clipped_frac"]) == 0
    assert float(sums["correction/weight_mean"]) == float(sums["correction/weight_sq_mean"]) == float(sums["tokens"])
    plain = rl_objective(**x, cfg=LossConfig(correction="none"))[0]
    assert float(plain) == float(rl_objective(**dict(x, behaviour_logp=None), cfg=LossConfig(correction="none"))[0])
    assert float(plain) != float(rl_objective(**x, cfg=LossConfig())[0])


def test_a_bound_below_one_names_the_way_to_turn_the_correction_off():
    from pc_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="tis_cap=0.5: .* algo.loss.correction=none"):
        LossConfig(tis_cap=0.5).validate()


def test_a_correction_without_behaviour_logprobs_is_refused_before_and_during_a_pass():
    x = _inputs()
    x.pop("behaviour_logp")
    cfg = LossConfig(tis_cap=2.0)
    with pytest.raises(ValueError, match="behaviour"):
        check_inputs(cfg, has_behaviour_logp=False)
    with pytest.raises(ValueError, match="behaviour"):
        rl_objective(**x, cfg=cfg)
    with pytest.raises(ValueError, match="norm_tokens"):
        check_inputs(LossConfig(agg="seq-mean-token-sum-norm"), has_behaviour_logp=True)
    check_inputs(cfg, has_behaviour_logp=True)


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
    got = _token_losses(logp, logp.clone(), adv, LossConfig(correction="none"))
    assert torch.allclose(got["loss"], -adv.expand(3, 5).double())
    assert got["clipped"].sum() == 0


def test_clip_low_and_high_bounds_are_separate():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, correction="none")
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
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, correction="none")
    logp = torch.log(torch.tensor([[1.28, 0.8]])).requires_grad_()
    loss, _, _ = rl_objective(
        logp, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), cfg
    )
    loss.backward()
    assert torch.all(logp.grad != 0)


def test_kl_penalty_is_zero_at_reference_and_positive_elsewhere():
    cfg = LossConfig(kl_coef=0.5, correction="none")
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
