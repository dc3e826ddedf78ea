"""Rewards by name or as ``module:function`` (``pc_megatron/rewards/__init__.py``): the integer match, DAPO's
overlong penalty, user functions, bad settings."""

from __future__ import annotations

import pytest

from pc_megatron.errors import ConfigError
from pc_megatron.rewards import IntegerMatchReward, build_reward, overlong_penalty
from pc_megatron.rewards.config import RewardConfig


def test_integer_reward():
    r = IntegerMatchReward()
    assert r("42", "42").correct and r(" 42 ", "42").score == 1.0
    assert not r("42x", "42").correct and not r("", "42").correct and not r("41", "42").correct
    assert r("-7", "-7").correct


@pytest.mark.parametrize(("length", "expected"), [(100, 0.0), (768, 0.0), (896, -0.5), (1024, -1.0), (1100, -1.0)])
def test_overlong_penalty_falls_linearly_over_the_buffer(length, expected):
    assert overlong_penalty(length, max_len=1024, buffer=256, factor=1.0) == pytest.approx(expected)
    assert overlong_penalty(length, max_len=1024, buffer=0, factor=1.0) == 0.0


def test_function_rewards_and_bad_config():
    r = build_reward(RewardConfig(function="rewards_for_tests:scored"))
    assert (r("3", "3").score, r("3", "3").correct, r("2", "3").score, r("2", "3").correct) == (1.0, True, -1.0, False)
    with pytest.raises(ConfigError, match="write it as module:function"):
        build_reward(RewardConfig(function="rewards_for_tests.exact"))
    with pytest.raises(ConfigError, match="cannot be loaded.*PYTHONPATH"):
        build_reward(RewardConfig(function="no_such_module_xyz:f"))
    with pytest.raises(ConfigError, match="reward.on_error"):
        RewardConfig(on_error="ignore").validate()
    with pytest.raises(ConfigError, match="reward.workers"):
        RewardConfig(workers=0).validate()
