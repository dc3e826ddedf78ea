"""The scheduler's settings (``pc_megatron/scheduler/config.py``): a bad one is refused naming it."""

import pytest

from pc_megatron.scheduler import Scheduler, SchedulerConfig


def test_bad_config_is_rejected():
    from pc_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="scheduler.policy: 'ppo' is not one of grpo, dapo, pilot_commit"):
        Scheduler(SchedulerConfig(policy="ppo"), 10, 2, 8, 0)
    with pytest.raises(ConfigError, match="leaves no commit samples"):
        Scheduler(SchedulerConfig(policy="pilot_commit", pilot_samples=8), 10, 2, 8, 0)
    with pytest.raises(ConfigError, match="p_lower <= p_upper"):
        Scheduler(SchedulerConfig(p_lower=0.9, p_upper=0.1), 10, 2, 8, 0)
