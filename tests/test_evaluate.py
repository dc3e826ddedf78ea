"""Held-out evaluation (``pc_megatron/evaluate.py``): the rollout's sampling settings, the rewards that
failed counted, and the exact expected accuracy over a disjoint set."""

from __future__ import annotations

import pytest

from pc_megatron.config import load_config
from tests.settings import WORKERS


def test_evaluation_samples_with_the_rollout_stop_tokens(cache_dir):
    """Stop tokens are part of how the policy is sampled: held-out accuracy must use them too
    (stopping at any digit cuts every multi-digit answer short)."""

    from pc_megatron.evaluate import evaluate
    from pc_megatron.model.tokenizer import load_tokenizer
    from pc_megatron.rewards.config import RewardConfig
    from pc_megatron.rewards.pool import RewardPool
    from pc_megatron.rollout.config import SamplingParams
    from pc_megatron.rollout.engines import build_engine
    from pc_megatron.run.prepare import initial_policy_dir, load_task

    cfg = load_config("tiny", ["eval.num_prompts=60", "eval.temperature=0"])
    policy = initial_policy_dir(cfg)
    tok = load_tokenizer(policy)
    rows = [r for r in load_task(cfg).eval if len(r.answer) > 1]
    engine = build_engine(cfg.rollout, policy)
    digits = tuple(tok.convert_tokens_to_ids(list("0123456789")))
    with RewardPool(RewardConfig()) as rewards:
        plain = evaluate(engine, tok, rows, cfg.eval, rewards, SamplingParams(max_new_tokens=8), seed=0)
        stop = SamplingParams(max_new_tokens=8, stop_token_ids=digits)
        stopped = evaluate(engine, tok, rows, cfg.eval, rewards, stop, seed=0)
    assert plain["eval_accuracy"] > 0.2 and stopped["eval_accuracy"] == 0.0


def test_evaluation_counts_the_rewards_that_timed_out_or_raised(cache_dir, monkeypatch):
    """A held-out accuracy that falls because the reward failed must say so, as a training row does."""
    from pc_megatron.evaluate import evaluate
    from pc_megatron.model.tokenizer import load_tokenizer
    from pc_megatron.rewards.config import RewardConfig
    from pc_megatron.rewards.pool import RewardPool
    from pc_megatron.rollout.config import SamplingParams
    from pc_megatron.rollout.engines import build_engine
    from pc_megatron.run.prepare import initial_policy_dir, load_task

    monkeypatch.syspath_prepend(str(WORKERS))  # the pool hands sys.path to its workers
    cfg = load_config("tiny", ["eval.temperature=0"])
    policy = initial_policy_dir(cfg)
    tok = load_tokenizer(policy)
    eval_rows = load_task(cfg).eval
    rows = [r for r in eval_rows if r.answer[-1] in "37"][:4] + [r for r in eval_rows if r.answer[-1] in "0"][:4]
    engine = build_engine(cfg.rollout, policy)
    reward = RewardConfig(function="rewards_for_tests:fails_on_some_answers", workers=2, timeout_s=0.5)
    reward.on_error, reward.max_failure_frac = "count", 0.6
    with RewardPool(reward) as rewards:
        out = evaluate(engine, tok, rows, cfg.eval, rewards, SamplingParams(max_new_tokens=8), seed=0)
    hangs = sum(r.answer.endswith("3") for r in rows)
    assert 0 < hangs < 4, [r.answer for r in rows]  # both kinds of failure are in the set
    assert out["eval/reward_timeouts"] == hangs and out["eval/reward_errors"] == 4 - hangs


def test_expected_accuracy_is_the_exact_pass_rate_over_a_disjoint_held_out_set(cache_dir):
    """eval_expected_accuracy: the learner's teacher-forced P(answer + EOS) at the sampling
    temperature equals the HF model's (pools.answer_pass_rates, itself checked against 400
    samples per prompt in tests/embedded/test_pools.py), over a set disjoint from every split and the pool."""

    from pc_megatron.data.task import expected_eval_set
    from pc_megatron.embedded.pools import answer_pass_rates
    from pc_megatron.evaluate import expected_accuracy
    from pc_megatron.learner.learner import Learner
    from pc_megatron.model.tokenizer import load_tokenizer
    from pc_megatron.run.prepare import initial_policy_dir, load_task

    cfg = load_config("tiny", ["data.synthetic.num_eval_expected=300", "rollout.temperature=0.8"])
    task = load_task(cfg)
    rows = expected_eval_set(cfg.data, cfg.eval.expected, task)
    assert rows[: len(task.eval)] == task.eval and len(rows) == len(task.eval) + 300
    seen = {r.prompt for split in (task.train, task.eval, task.sft) for r in split}
    assert not seen & {r.prompt for r in rows[len(task.eval) :]}
    policy = initial_policy_dir(cfg)
    learner = Learner(policy, cfg.learner, seed=0)
    got = expected_accuracy(learner, load_tokenizer(policy), rows, 0.8)
    want = answer_pass_rates(policy, rows, 0.8)
    assert got["eval_expected_accuracy"] == pytest.approx(sum(want) / len(want), abs=1e-5)
    assert 0.05 < got["eval_expected_accuracy"] < 0.95
    assert {k.split("/")[1] for k in got if "/" in k} == {r.meta["family"] for r in rows}
    mix = dict(cfg.data.synthetic.mix)
    weighted = expected_accuracy(learner, load_tokenizer(policy), rows, 0.8, mix)
    fam = {k.split("/")[1]: v for k, v in got.items() if "/" in k}
    want_w = sum(mix[f] * m for f, m in fam.items()) / sum(mix[f] for f in fam)
    assert weighted["eval_expected_accuracy"] == pytest.approx(want_w, abs=1e-6)
    off = load_config("tiny", ["eval.expected=false"])
    assert expected_eval_set(off.data, off.eval.expected, task) == []


def test_an_evaluation_interval_of_zero_is_refused_before_the_run():
    """It divided the step number after the first update (ZeroDivisionError mid-run)."""
    import pytest

    from pc_megatron.config import load_config
    from pc_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match=r"eval.every_steps must be > 0 \(got 0\)"):
        load_config("tiny", ["eval.every_steps=0"])
