"""RL pools of the embedded task (``pc_megatron/embedded/pools.py``): easy and graded, chosen by the initial
exact pass rate; held-out and SFT unchanged."""

import math

import pytest
import torch

from pc_megatron.config import load_config
from pc_megatron.data.dataset import PromptRow
from pc_megatron.embedded.pools import answer_pass_rates
from pc_megatron.errors import ConfigError
from pc_megatron.rewards.config import RewardConfig
from pc_megatron.rewards.pool import RewardPool
from pc_megatron.rollout.config import RolloutConfig
from pc_megatron.rollout.engines import build_engine
from pc_megatron.rollout.generate import encode_prompts, generate_and_score
from pc_megatron.run.prepare import initial_policy_dir, load_task, rl_pool, warm_started
from tests.settings import SMALL


def test_exact_pass_rate_matches_sampling():
    """P(answer + EOS) from one forward pass equals the sampled pass rate of the engine, within
    binomial noise (it ignores rare other correct spellings, so it may only be slightly lower)."""
    cfg = load_config("tiny")
    policy = initial_policy_dir(cfg)  # the shipped warm-start: pass rates well inside (0, 1)
    rows = [PromptRow(str(i), p, a) for i, (p, a) in enumerate([("58+37=", "95"), ("83-46=", "37"), ("7*8=", "56")])]
    exact = answer_pass_rates(policy, rows, temperature=1.0)
    from pc_megatron.model.tokenizer import load_tokenizer

    tok = load_tokenizer(policy)
    engine = build_engine(RolloutConfig(temperature=1.0, max_new_tokens=8), policy)
    k = 400
    with RewardPool(RewardConfig()) as rewards:
        comps, scored = generate_and_score(
            engine, tok, rewards, rows, encode_prompts(tok, rows), k, RolloutConfig().sampling(), seed=0
        )
    results = scored.results
    owners = [rows[c.prompt_index] for c in comps]
    sampled = [sum(res.correct for res, o in zip(results, owners, strict=True) if o is r) / k for r in rows]
    assert any(0.05 < p < 0.95 for p in exact), exact  # the check below is not vacuous
    for p, s in zip(exact, sampled, strict=True):
        assert abs(s - p) <= 4 * math.sqrt(max(p * (1 - p), 0.01) / k), (exact, sampled)


def test_easy_pool_keeps_held_out_and_sft_and_filters_train(cache_dir):
    hard_cfg = load_config("tiny", SMALL)
    hard = load_task(hard_cfg)
    policy = warm_started(hard_cfg, hard.sft, progress=False)
    rates = sorted(answer_pass_rates(policy, hard.train, hard_cfg.rollout.temperature))
    lo, hi = rates[len(rates) // 4], rates[3 * len(rates) // 4]  # a band the hard pool half fills
    easy_cfg = load_config("tiny", [*SMALL, "data.synthetic.pool=easy", f"data.synthetic.easy_pass_band=[{lo},{hi}]"])
    task = load_task(easy_cfg)
    assert warm_started(easy_cfg, task.sft, progress=False) == policy
    easy = rl_pool(easy_cfg, task, policy, progress=False)
    assert easy.eval == hard.eval and easy.sft == hard.sft
    assert len(easy.train) == len(hard.train) == easy_cfg.data.synthetic.num_train
    assert len({r.prompt for r in easy.train}) == len(easy.train)
    assert not {r.prompt for r in easy.train} & {r.prompt for r in easy.eval}
    recomputed = answer_pass_rates(policy, easy.train, easy_cfg.rollout.temperature)
    assert all(lo - 1e-6 <= p <= hi + 1e-6 for p in recomputed)
    stored = torch.tensor([r.meta["initial_pass_rate"] for r in easy.train])
    torch.testing.assert_close(stored, torch.tensor(recomputed), rtol=1e-4, atol=1e-6)
    assert rl_pool(easy_cfg, task, policy, progress=False).train == easy.train  # cached, same rows
    assert rl_pool(hard_cfg, hard, policy, progress=False) is hard


def test_graded_pool_has_the_asked_shares_of_hopeless_and_solved_prompts(cache_dir):
    """data.synthetic.pool=graded: exactly hopeless_frac of the prompts below an exact initial
    pass rate of 0.02, solved_frac above 0.98, the rest in between; held-out and SFT unchanged."""
    from pc_megatron.embedded.pools import degenerate_share

    over = ["data.synthetic.pool=graded", "data.synthetic.hopeless_frac=0.45", "data.synthetic.solved_frac=0.25"]
    cfg = load_config("tiny", over)
    base = load_task(load_config("tiny"))
    task = load_task(cfg)
    policy = warm_started(cfg, task.sft, progress=False)
    assert policy == initial_policy_dir(cfg)  # the shipped warm-start: the pool changes nothing upstream
    graded = rl_pool(cfg, task, policy, progress=False)
    assert graded.eval == base.eval and graded.sft == base.sft
    n = cfg.data.synthetic.num_train
    stored = [r.meta["initial_pass_rate"] for r in graded.train]
    assert len(stored) == n and len({r.prompt for r in graded.train}) == n
    assert sum(p < 0.02 for p in stored) == round(0.45 * n) and sum(p > 0.98 for p in stored) == round(0.25 * n)
    assert not {r.prompt for r in graded.train} & {r.prompt for r in base.eval}
    sample = graded.train[:: n // 200]
    recomputed = answer_pass_rates(policy, sample, cfg.rollout.temperature)
    assert torch.allclose(
        torch.tensor(recomputed), torch.tensor([r.meta["initial_pass_rate"] for r in sample]), atol=1e-4
    )
    assert degenerate_share(stored, 8) > 0.7 > degenerate_share([0.5] * 10, 8)
    with pytest.raises(ConfigError, match="sum <= 1"):
        load_config(
            "tiny", ["data.synthetic.pool=graded", "data.synthetic.hopeless_frac=0.8", "data.synthetic.solved_frac=0.3"]
        )
    with pytest.raises(ConfigError, match="set data.synthetic.pool=graded"):
        load_config("tiny", ["data.synthetic.hopeless_frac=0.3"])

    # a smaller pool of the same shares: the first prompts of each band, held-out and warm-start unchanged
    small_cfg = load_config("tiny", [*over, "data.synthetic.pool_size=400"])
    small = rl_pool(small_cfg, load_task(small_cfg), warm_started(small_cfg, task.sft, progress=False), False)
    assert small.eval == base.eval and small.sft == base.sft and len(small.train) == 400
    assert {r.prompt for r in small.train} <= {r.prompt for r in graded.train}
    rates = [r.meta["initial_pass_rate"] for r in small.train]
    assert sum(p < 0.02 for p in rates) == 180 and sum(p > 0.98 for p in rates) == 100
    hard = rl_pool(load_config("tiny", ["data.synthetic.pool_size=100"]), base, policy, progress=False)
    assert hard.train == base.train[:100]
    with pytest.raises(ConfigError, match="pool_size=5000: must be between 0"):
        load_config("tiny", ["data.synthetic.pool_size=5000"])
